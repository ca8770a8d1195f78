"""chat_format.json (compiler/chat_format.py): a chat template cut into plain strings for the Android app. Whatever
the template, the strings must rebuild the template's own rendering: one turn, one turn after a system prompt, and
later turns appended to what came before; where a template cannot be extended that way, no `next` is given."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgellm.compiler.chat_format import FILE, derive, write_chat_format
from edgellm.runtime.python.text import TextCodec

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo" / "demo-llama"

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
          "{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else "
         "message['role'] %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
# a header that counts the turns: a longer conversation does not extend a shorter one
COUNTED = ("{{ 'turns: ' + (messages | length | string) + '\\n' }}{% for m in messages %}{{ m['role'] + ': ' + "
           "m['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "mistral": MISTRAL, "gemma": GEMMA, "counted": COUNTED}
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def _codec(tmp_path: Path, template: str | None) -> TextCodec:
    shutil.copyfile(DEMO / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = {**SPECIALS, **({"chat_template": template} if template else {})}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return TextCodec(tmp_path)


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_strings_rebuild_the_template(tmp_path, name):
    codec = _codec(tmp_path, TEMPLATES[name])
    fmt = derive(codec)
    assert fmt is not None
    u1, a1, u2, a2, u3, sys_ = "Hi there, café \U0001F642", "Hello! How can I help?", "Add 2 and 3", "5.", "Thanks", "Be brief."
    first = fmt["first"][0] + u1 + fmt["first"][1]
    assert first == codec.apply_chat_template(_msgs(("user", u1)))
    if name in ("mistral", "gemma"):
        assert fmt["first_system"] is None   # these templates refuse a system message
    else:
        s = fmt["first_system"]
        assert s[0] + sys_ + s[1] + u1 + s[2] == codec.apply_chat_template(_msgs(("system", sys_), ("user", u1)))
    if name == "counted":
        assert fmt["next"] is None
        return
    nxt = fmt["next"]
    two = first + a1 + nxt[0] + u2 + nxt[1]
    assert two == codec.apply_chat_template(_msgs(("user", u1), ("assistant", a1), ("user", u2)))
    three = two + a2 + nxt[0] + u3 + nxt[1]
    assert three == codec.apply_chat_template(_msgs(("user", u1), ("assistant", a1), ("user", u2), ("assistant", a2),
                                                    ("user", u3)))
    # the turn end becomes a stop id when it is one token, else a stop string
    assert bool(fmt["stop_ids"]) != bool(fmt["stop"])


def test_turn_end_token_is_a_stop_id(tmp_path):
    # the demo tokenizer knows <|endoftext|> as one token: the demo template's turn end is that id
    codec = TextCodec(DEMO)
    fmt = derive(codec)
    assert fmt["stop_ids"] == codec.tok.encode("<|endoftext|>", add_special_tokens=False).ids and fmt["stop"] == []
    # ChatML's <|im_end|> is no token of the demo vocabulary: it is a stop string instead
    fmt = derive(_codec(tmp_path, CHATML))
    assert fmt["stop_ids"] == [] and fmt["stop"] == ["<|im_end|>"]


def test_no_template_writes_no_file(tmp_path):
    _codec(tmp_path, None)
    assert derive(TextCodec(tmp_path)) is None
    assert write_chat_format(tmp_path) is False and not (tmp_path / FILE).exists()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert write_chat_format(tmp_path) is False   # a corrupt file is the Runtime's to report, not the compiler's


def test_compiled_package_carries_it(demo_q8):
    from edgellm.runtime.python.package import verify_package

    pkg = demo_q8
    fmt = json.loads((pkg / FILE).read_text())
    assert fmt == derive(TextCodec(DEMO))
    verify_package(pkg)   # listed in SHA256SUMS like every other file

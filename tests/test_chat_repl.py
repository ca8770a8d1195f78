"""`edgellm chat` through a pseudo-terminal (pexpect) and through a pipe: two turns, the second one prefilling only
the tokens its prompt adds to what the KV cache holds (the first turn's prompt and reply are not prefilled again);
the replies equal the Python Runtime's; /reset and /system start over."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("tvm")

from edgellm.runtime.python.api import Runtime  # noqa: E402

U1, U2 = "Write a function that adds two numbers", "Now make it multiply"
STATS = r"\[prefill (\d+) new tokens \((\d+) cached\)"
ARGS = ["--temperature", "0", "-n", "16", "--threads", "1"]


@pytest.fixture(scope="module")
def pkg(demo_q8):
    return demo_q8


def expected(pkg):
    """(prompt ids of turn 1, its reply, prompt ids of turn 2, what the cache holds after turn 1)."""
    with Runtime.load(pkg, threads=1) as rt:
        ctx = rt.new_context()
        m = [{"role": "user", "content": U1}]
        first = ctx.chat(m, max_new_tokens=16, temperature=0)
        p1 = rt.encode(rt.text.apply_chat_template(m), add_special_tokens=False)
        m += [{"role": "assistant", "content": first.text}, {"role": "user", "content": U2}]
        p2 = rt.encode(rt.text.apply_chat_template(m), add_special_tokens=False)
        second = rt.new_context().chat(m, max_new_tokens=16, temperature=0)
        return p1, first, p2, ctx.cached, second


def _lcp(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_two_turns_in_a_terminal_prefill_only_new_tokens(pkg):
    p1, first, p2, kv1, second = expected(pkg)
    child = pexpect.spawn(sys.executable, ["-m", "edgellm.cli", "chat", str(pkg), *ARGS], encoding="utf-8",
                          timeout=60, env={**os.environ, "TERM": "dumb"}, dimensions=(50, 200))
    try:
        child.expect("/reset")   # the banner
        child.expect("> ")
        child.sendline(U1)
        child.expect(STATS)
        new1, cached1 = int(child.match.group(1)), int(child.match.group(2))
        reply1 = child.before
        child.expect("> ")
        child.sendline(U2)
        child.expect(STATS)
        new2, cached2 = int(child.match.group(1)), int(child.match.group(2))
        reply2 = child.before
        child.expect("> ")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    assert (new1, cached1) == (len(p1), 0)
    lcp = _lcp(kv1, p2)
    assert lcp >= len(p1), "turn 2 re-prefilled turn 1"
    assert (new2, cached2) == (len(p2) - lcp, lcp)   # only the tokens turn 2 adds
    assert new2 < len(p2) - len(p1)
    norm = lambda s: s.replace("\r\n", "\n")   # noqa: E731 - the terminal's line endings
    assert first.text in norm(reply1) and second.text in norm(reply2)


def test_piped_turns_reset_and_system(pkg):
    stdin = "\n".join([U1, U2, "/reset", U1, "/system You are terse.", U1, "/quit"]) + "\n"
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "chat", str(pkg), *ARGS], input=stdin,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    stats = [(int(a), int(b)) for a, b in re.findall(STATS, r.stderr)]
    assert len(stats) == 4, r.stderr
    p1, first, p2, kv1, second = expected(pkg)
    assert stats[0] == (len(p1), 0) and stats[1][1] >= len(p1)
    # after /reset the same first message prefills again, save what the cache shares with it
    assert stats[2][0] + stats[2][1] == len(p1) and "[new conversation]" in r.stderr
    assert "[system prompt set; new conversation]" in r.stderr
    assert r.stdout.startswith(first.text) and r.stdout.count("\n") >= 4
    assert "> " not in r.stdout   # no prompt when stdin is not a terminal


def test_a_bad_line_keeps_the_conversation(pkg):
    """A line that is not UTF-8 gets a one-line error and the conversation goes on: the next turn's prompt comes
    from the cache the first turn left (issue 40: the REPL used to exit, losing it)."""
    stdin = U1.encode() + b"\n\xff\xfe not text\n" + U2.encode() + b"\n/quit\n"
    r = subprocess.run([sys.executable, "-m", "edgellm.cli", "chat", str(pkg), *ARGS], input=stdin,
                       capture_output=True, timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "[error: " in err and "UTF-8" in err
    stats = [(int(a), int(b)) for a, b in re.findall(STATS, err)]
    p1, first, p2, kv1, second = expected(pkg)
    assert len(stats) == 2 and stats[0] == (len(p1), 0) and stats[1][1] >= len(p1)

"""Every README.md command runs as written (tests/readme_blocks.py says how blocks are chosen and marked).

Bash blocks run with `bash -e -o pipefail` and Python blocks with this interpreter, each in a fresh directory that
holds the repository's models/ and bench/ (the README's commands are written for a clone's root), against the demo
models. `pytest -rs tests/test_readme.py` lists the blocks that do not run here and why."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from readme_blocks import README, RUN, blocks

ROOT = README.parent
BLOCKS = [b for b in blocks() if b.lang in RUN]


def test_every_command_block_is_run_or_says_why():
    """Shell and Python blocks carry their language (an untagged block would escape this test), and each one that
    does not run names its reason."""
    for b in blocks():
        first = b.code.lstrip().split("\n")[0]
        assert b.lang or not first.startswith(("edgellm ", "python ", "pip ", "import ", "from ")), \
            f"{b.id}: a command block without a language tag"
        assert b.skip is None or len(b.skip) > 8, f"{b.id}: say why it does not run"
    assert sum(b.skip is None for b in BLOCKS) >= 12


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for name in ("models", "bench"):
        (d / name).symlink_to(ROOT / name)
    return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(workdir):
    port = _free_port()
    p = subprocess.Popen([sys.executable, "-m", "edgellm.cli", "serve", "demo", "--port", str(port)], cwd=workdir,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if p.poll() is not None:
                    raise RuntimeError(p.stderr.read()[-2000:]) from None
                time.sleep(0.5)
        yield port
    finally:
        p.terminate()
        p.wait(30)


def _missing(code: str) -> str | None:
    """What this machine lacks for a block (the same skips as the backends' own tests), or None."""
    if "--target opencl" in code:
        from test_opencl import _opencl_device

        if not _opencl_device():
            return "no OpenCL platform (apt-get install pocl-opencl-icd)"
    if "-npu" in code:
        from edgellm.compiler.onnx_qnn import qnn_ort

        if not qnn_ort.qnn_available():
            return "needs onnxruntime-qnn"
    return None


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block, workdir, request):
    if block.skip:
        pytest.skip(block.skip)
    if _missing(block.code):
        pytest.skip(_missing(block.code))
    code = block.code
    if block.server:
        code = code.replace("127.0.0.1:8080", f"127.0.0.1:{request.getfixturevalue('server')}")
    cmd = ["bash", "-e", "-o", "pipefail", "-c", code] if block.lang == "bash" else [sys.executable, "-c", code]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                       env=env)
    assert r.returncode == 0, f"{block.id} failed ({r.returncode}):\n{code}\n--- stdout\n{r.stdout[-3000:]}\n" \
                              f"--- stderr\n{r.stderr[-3000:]}"

"""`edgellm bench`: JSON keys, decode token count, errors."""
from __future__ import annotations

import json

import pytest

import edgellm
from edgellm.cli import main
from edgellm.models.synthetic import make_checkpoint
from edgellm.runtime.python.bench import bench, prompt_ids


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    ck = make_checkpoint(root / "ck", seed=5, tokenizer=False)
    return edgellm.compile(str(ck), quant="f32", out=root / "pkg", max_context=64, prefill_chunk=8, progress=False)


def test_bench_json(pkg, capsys):
    assert main(["bench", str(pkg), "--prompt-len", "12", "--gen-len", "7", "--threads", "1", "--reps", "2",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for k in ("prefill_tok_s", "decode_tok_s", "ttft_s", "peak_rss_mb", "weights_read_per_token"):
        assert isinstance(r[k], (int, float)) and r[k] > 0, k
    assert r["decode_tokens"] == 7 and r["prompt_len"] == 12 and r["threads"] == 1
    assert len(r["decode_tok_s_all"]) == 2
    assert r["weights_read_per_token"] < r["weights_bytes"]
    assert r["weights_huge_pages_bytes"] == 0   # a tiny package stays mmapped (huge pages from 16 huge pages up)


def test_bench_text_and_errors(pkg, capsys):
    assert main(["bench", str(pkg), "--prompt-len", "4", "--gen-len", "2", "--reps", "1"]) == 0
    assert "decode" in capsys.readouterr().out
    assert main(["bench", str(pkg), "--prompt-len", "60", "--gen-len", "10"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "context" in err and err.count("\n") == 1
    assert main(["bench", str(pkg / "missing")]) == 1


def test_prompt_ids_avoid_eos():
    ids = prompt_ids(5, 200, {1, 3}, seed=0)
    assert set(ids.tolist()) == {0, 2, 4}
    assert (prompt_ids(5, 20, {1}, seed=1) == prompt_ids(5, 20, {1}, seed=1)).all()


def test_bench_counts_decode_steps(pkg):
    r = bench(pkg, prompt_len=3, gen_len=5, threads=1, reps=1, warmup=0)
    assert r["decode_tokens"] == 5 and r["warmup"] == 0


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_streaming_checkpoint_equals_in_memory(tmp_path, dtype):
    from safetensors.numpy import load_file

    a = load_file(str(make_checkpoint(tmp_path / "a", seed=2, dtype=dtype, tokenizer=False, ternary=True)
                      / "model.safetensors"))
    b = load_file(str(make_checkpoint(tmp_path / "b", seed=2, dtype=dtype, tokenizer=False, ternary=True,
                                      streaming=True) / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and (a[k] == b[k]).all() for k in a)


def _vs_llamacpp():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "vs_llamacpp.py"
    spec = importlib.util.spec_from_file_location("vs_llamacpp", path)
    vs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vs)
    return vs


def test_vs_llamacpp_bandwidth_share_per_run():
    """Each side's share of the bandwidth is its decode traffic over the mean of the membw readings around its own
    run (bandwidth moves within a round), then the median over the legs whose two readings agree within STEADY (the
    host kept one bandwidth state around the run), or over every leg where none does; the ratios are per leg too."""
    vs = _vs_llamacpp()
    assert vs.STEADY == 0.15
    mb = 1e6
    def side(prefill, decode, read_mb, rss):
        return {"prefill": prefill, "decode": decode, "read_per_token": read_mb * mb, "rss_mb": rss}

    rounds = [{"membw_gbs": [50.0, 46.0, 38.0], "edgellm": side(200, 100, 540, 1), "llamacpp": side(100, 80, 500, 2)},
              {"membw_gbs": [40.0, 40.0, 40.0], "edgellm": side(180, 60, 540, 3), "llamacpp": side(120, 60, 500, 4)}]
    s = vs.summarize(rounds)
    # edgellm: 54 GB/s over mean(50, 46) = 112.5% (steady: 50/46 < 1.15), 32.4 over 40 = 81%; llama.cpp: 40 over
    # mean(46, 38) is not steady (46/38 = 1.21): only 30 over 40 = 75% counts
    assert abs(s["bw_pct"]["edgellm"] - (112.5 + 81) / 2) < 1e-9
    assert abs(s["bw_pct"]["llamacpp"] - 75) < 1e-9
    assert s["bw_legs"] == {"edgellm": 2, "llamacpp": 1}
    assert s["decode"]["ratio_min"] == 1.0 and s["decode"]["ratio_max"] == 1.25
    assert s["prefill"]["ratio"] == (2.0 + 1.5) / 2 and s["membw_gbs"] == 40.0
    assert s["peak_rss_mb"] == {"edgellm": 3, "llamacpp": 4}
    # no steady leg: the median over all of them
    unsteady = [dict(r, membw_gbs=[60.0, 40.0, 60.0]) for r in rounds]
    s0 = vs.summarize(unsteady)
    assert abs(s0["bw_pct"]["edgellm"] - (100 * 54 / 50 + 100 * 32.4 / 50) / 2) < 1e-9 and s0["bw_legs"]["edgellm"] == 0
    # a second edgellm side (another --tune mode) runs between edgellm and llama.cpp: its own readings around it
    for r, off in zip(rounds, (side(100, 50, 540, 1), side(90, 30, 540, 1))):
        r["edgellm-off"] = off
        r["llamacpp"] = r.pop("llamacpp")   # keep run order: edgellm, edgellm-off, llamacpp
        r["membw_gbs"] = [50.0, 46.0, 44.0, 38.0] if off["decode"] == 50 else [40.0] * 4
    s2 = vs.summarize(rounds, "edgellm-off")
    assert abs(s2["bw_pct"]["edgellm"] - (100 * 27 / 45 + 100 * 16.2 / 40) / 2) < 1e-9
    assert abs(s2["bw_pct"]["llamacpp"] - 75) < 1e-9   # 44/38 = 1.16: not steady
    assert vs.tune_gain(rounds, "edgellm-off") == {"prefill": (2.0 + 2.0) / 2, "decode": (2.0 + 2.0) / 2}


def test_gemv_profile_bandwidth_share_over_steady_runs():
    """bench/gemv_profile.py takes each kernel's and the whole token's share of the bandwidth by vs_llamacpp's steady
    rule: over the runs whose readings before and after agree within STEADY, over all where none does."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "gemv_profile.py"
    spec = importlib.util.spec_from_file_location("gemv_profile", path)
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    assert gp.vs.steady(40.0, 46.0) and not gp.vs.steady(40.0, 46.1)
    assert gp.vs.steady_median([(1.0, False), (3.0, True), (5.0, True)]) == (4.0, 2)
    assert gp.vs.steady_median([(1.0, False), (3.0, False)]) == (2.0, 0)
    k = "fused_gemv_q8_n2048_k5632"
    # token: 10 tok/s x 1000 MB = 10 GB/s; run 1 over mean(10, 10) = 100% (steady), run 2 over mean(10, 20) not
    runs = {"q8": [(10.0, 1000.0, [(k, 20.0, 9.0, 22)], (10.0, 10.0)),
                   (10.0, 1000.0, [(k, 30.0, 12.0, 22)], (10.0, 20.0))]}
    rows = gp.table(runs).splitlines()
    assert rows[2].split("|")[7:9] == [" 10.0 ", " 100 (1 of 2) "]
    cells = [c.strip() for c in rows[3].split("|")]
    assert cells[2:9] == [k, "2048x5632", "22", "25.0", "25.000", "10.5", "90"]   # 9 GB/s of 10: run 2 left out
    unsteady = {"q8": [(r[0], r[1], r[2], (10.0, 20.0)) for r in runs["q8"]]}
    cells = [c.strip() for c in gp.table(unsteady).splitlines()[3].split("|")]
    assert cells[8] == f"{(100 * 9 / 15 + 100 * 12 / 15) / 2:.0f}"


def test_vs_llamacpp_rebuilds_packages_built_from_other_sources(tmp_path, monkeypatch):
    """bench/vs_llamacpp.py reuses a cached package only while the sources it was built from are unchanged."""
    import subprocess
    from pathlib import Path

    vs = _vs_llamacpp()
    calls = []

    def fake_compile(cmd, **kw):
        out = Path(cmd[cmd.index("-o") + 1])
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")
        calls.append(out)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(vs.subprocess, "run", fake_compile)
    model = tmp_path / "llama-small-seed0"
    assert vs.source_stamp(256) == vs.source_stamp(256) != vs.source_stamp(512)
    out, _, _ = vs.compile_package(tmp_path, model, "t2", 256, "quick")
    assert len(calls) == 1 and (out / "bench-stamp").read_text() == vs.source_stamp(256)
    # t2 packages carry a q6 head, as TQ2_0 files a Q6_K; each tune mode has its own package
    assert out.name == "llama-small-seed0-t2-head-q6-tune-quick.edgellm"
    vs.compile_package(tmp_path, model, "t2", 256, "quick")
    assert len(calls) == 1  # cached
    (out / "bench-stamp").write_text("0123456789abcdef")  # built from older sources
    vs.compile_package(tmp_path, model, "t2", 256, "quick")
    assert len(calls) == 2
    vs.compile_package(tmp_path, model, "t2", 512, "quick")  # other options
    assert len(calls) == 3
    vs.compile_package(tmp_path, model, "t2", 512, "off")
    assert len(calls) == 4

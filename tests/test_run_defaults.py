"""`edgellm run` sampling defaults: command line > the package's generation_config.json (when do_sample) > greedy."""
import json

from edgellm.runtime.package import sampling_defaults

NONE = {"temperature": None, "top_k": None, "top_p": None, "repetition_penalty": None}


def test_greedy_without_generation_config(tmp_path):
    s, src = sampling_defaults(tmp_path, NONE)
    assert s == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "repetition_penalty": 1.0} and src == "greedy"


def test_generation_config_applies_only_when_sampling(tmp_path):
    cfg = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}
    (tmp_path / "generation_config.json").write_text(json.dumps({**cfg, "do_sample": False}))
    assert sampling_defaults(tmp_path, NONE)[0]["temperature"] == 0.0
    (tmp_path / "generation_config.json").write_text(json.dumps({**cfg, "do_sample": True}))
    s, src = sampling_defaults(tmp_path, NONE)
    assert s == cfg and "generation_config.json" in src
    s, src = sampling_defaults(tmp_path, {**NONE, "temperature": 0.0})   # -- temperature 0 on the command line wins
    assert s["temperature"] == 0.0 and src == "greedy"
    s, _ = sampling_defaults(tmp_path, {**NONE, "top_k": 5})
    assert s == {**cfg, "top_k": 5}


def test_demo_models_sample_by_default():
    from edgellm.models.demo import DEMO_DIR

    for d in ("demo-llama", "demo-moe", "demo-bitnet"):
        s, _ = sampling_defaults(DEMO_DIR / d, NONE)
        assert s["temperature"] > 0, d

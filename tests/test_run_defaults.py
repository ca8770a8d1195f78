"""Sampling defaults: the compiler turns generation_config.json into the package's defaults (plan.bin), which every
front end starts from (el_gen_params_default); what the user gives overrides them."""
from edgellm.cli import NEUTRAL, describe_sampling
from edgellm.models.tokenizer_files import generation_defaults


def test_demo_models_sample_by_default():
    from edgellm.models.demo import DEMO_DIR

    for d in ("demo-llama", "demo-moe", "demo-bitnet"):
        s = generation_defaults(DEMO_DIR / d)
        assert s["temperature"] > 0 and s["repetition_penalty"] > 1, d


def test_describe_sampling():
    pkg = {**NEUTRAL, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}
    none = dict.fromkeys(NEUTRAL)
    assert describe_sampling(NEUTRAL, none) == "greedy"
    assert describe_sampling(pkg, none) == ("sampled with temperature 0.8, top-k 40, top-p 0.95, repetition-penalty 1.1 "
                                            "(package defaults from generation_config.json)")
    # --temperature 0: greedy, and the package's repetition penalty still applies (as in transformers and llama.cpp)
    assert describe_sampling(pkg, {**none, "temperature": 0.0}) == ("greedy, repetition-penalty 1.1 (package defaults "
                                                                    "from generation_config.json)")
    assert describe_sampling(pkg, {**none, "temperature": 0.0, "repetition_penalty": 1.0}) == "greedy"

"""The numpy reference backend against transformers (torch CPU, float32): logits and greedy tokens."""
import numpy as np
import pytest

from edgellm.models import load_checkpoint
from edgellm.models.numpy_backend import NumpyModel
from edgellm.models.synthetic import make_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = [5, 17, 33, 2, 99, 250, 7, 64, 128, 3, 11, 300]


def hf_greedy(model, ids, n):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def test_mixtral_numpy_matches_transformers(tmp_path):
    check_against_transformers(make_checkpoint(tmp_path / "moe", "MixtralForCausalLM", seed=11))


# RoPE scalings beyond the TINY set (llama3 is there): YaRN as Qwen2.5 / DeepSeek-style configs write it, and
# dynamic NTK (its tables equal the default ones inside max_position_embeddings)
ROPE_SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "mscale": 0.707,
                    "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                              "attention_factor": 1.3},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}


def test_llama_biases_match_transformers(tmp_path):
    """Llama with attention_bias (q/k/v and o) and mlp_bias (gate/up/down), the random biases nonzero."""
    d = make_checkpoint(tmp_path / "b", "LlamaForCausalLM", seed=4, attention_bias=True, mlp_bias=True)
    spec, ck, _ = load_checkpoint(str(d))
    assert spec.o_bias and spec.mlp_bias
    assert np.abs(np.asarray(ck.get("model.layers.0.self_attn.o_proj.bias"))).max() > 0
    check_against_transformers(d)


@pytest.mark.parametrize("name", sorted(ROPE_SCALINGS))
def test_rope_scalings_match_transformers(name, tmp_path):
    check_against_transformers(make_checkpoint(tmp_path / name, "LlamaForCausalLM", seed=3, max_position_embeddings=128,
                                               rope_theta=10000.0, rope_scaling=ROPE_SCALINGS[name]))


def test_numpy_matches_transformers(tiny_model):
    check_against_transformers(tiny_model)


def check_against_transformers(ckpt_dir):
    spec, ck, d = load_checkpoint(str(ckpt_dir))
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].numpy()
    ours = NumpyModel(spec, ck.get).logits(PROMPT)
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err < 1e-4, err
    with torch.no_grad():
        want = hf_greedy(hf, PROMPT, 32)
    assert NumpyModel(spec, ck.get).greedy(PROMPT, 32) == want

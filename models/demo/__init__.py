"""Bundled demo models (dense Llama, Mixtral MoE, BitNet b1.58, and a tiny draft model for speculative decoding)
and the scripts that train them.

`python -m edgellm.models.demo.train --model all` rebuilds the three from the Python standard library's own
source (PSF-2.0), offline, and `python -m edgellm.models.demo.train_draft` distils demo-draft from demo-llama; see
README.md in each model folder for the numbers.
"""
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
DEMO_MODELS = {"demo": "demo-llama", "demo-llama": "demo-llama", "demo-moe": "demo-moe", "demo-bitnet": "demo-bitnet",
               "demo-draft": "demo-draft"}
HELDOUT = DEMO_DIR / "heldout.txt"


def demo_path(name: str) -> Path | None:
    """Directory of a bundled demo model by name ("demo" is demo-llama), or None."""
    d = DEMO_MODELS.get(name)
    return DEMO_DIR / d if d and (DEMO_DIR / d / "config.json").is_file() else None

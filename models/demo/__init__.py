"""Bundled demo models (dense Llama, Mixtral MoE, BitNet b1.58) and the script that trains them.

`python -m edgellm.models.demo.train --model all` rebuilds them from the Python standard library's own
source (PSF-2.0), offline; see README.md in each model folder for the numbers.
"""
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
DEMO_MODELS = {"demo": "demo-llama", "demo-llama": "demo-llama", "demo-moe": "demo-moe", "demo-bitnet": "demo-bitnet"}
HELDOUT = DEMO_DIR / "heldout.txt"


def demo_path(name: str) -> Path | None:
    """Directory of a bundled demo model by name ("demo" is demo-llama), or None."""
    d = DEMO_MODELS.get(name)
    return DEMO_DIR / d if d and (DEMO_DIR / d / "config.json").is_file() else None

"""The wheel ships every subpackage: pyproject lists packages by hand (the repo root is `edgellm`), so a new
folder with an __init__.py that is not listed installs nowhere and only fails on a fresh machine."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    skip = {"tests", "bench", "build", "dist"}
    found = {"edgellm"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and (rel.parts[0] in skip or rel.parts[0].startswith(".") or "egg-info" in rel.parts[0]):
            continue
        found.add(".".join(("edgellm",) + rel.parts))
    assert found - listed == set(), f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"

"""Model definitions: HF config -> ModelSpec (registry), checkpoint reading, forward passes per family."""
from __future__ import annotations

from types import ModuleType

from .spec import ModelSpec


def family(spec: ModelSpec) -> ModuleType:
    """The module holding body()/head()/weight_shapes() (and optionally weight_transforms()/weight_sources()) for
    this spec's forward-pass family: models/<family>.py, so a new family is one new file."""
    import importlib

    from ..errors import ModelLoadError

    fam = spec.family
    mod = None
    if isinstance(fam, str) and fam.isidentifier() and not fam.startswith("_"):
        try:
            mod = importlib.import_module(f".{fam}", __name__)
        except ModuleNotFoundError:
            pass
    if mod is None or not all(hasattr(mod, f) for f in ("body", "head", "weight_shapes")):
        raise ModelLoadError(f"unknown model family {fam!r} (a package or spec from another edgellm version?)")
    return mod


def load_checkpoint(model: str):
    """(spec, checkpoint, model_dir) of a local dir or hub id, with every weight's presence, dtype and shape checked.

    Tied-embedding checkpoints that store the shared matrix only as `lm_head.weight` (as some tools save them)
    load too: `model.embed_tokens.weight` then reads it, and `checkpoint.notes` says so (one line for the user)."""
    from ..errors import ModelLoadError
    from .checkpoint import Checkpoint, read_config, resolve_model_dir
    from .registry import spec_from_config

    from . import gguf

    d = resolve_model_dir(model)
    cfg = read_config(d)
    spec = spec_from_config(cfg)
    ck = gguf.open_checkpoint(d, cfg) if gguf.is_sidecar(d) else Checkpoint(d)
    embed = "model.embed_tokens.weight"
    if spec.tie_word_embeddings and embed not in ck and "lm_head.weight" in ck:
        ck.alias(embed, "lm_head.weight")
        ck.notes.append("tied embeddings read from lm_head.weight (the checkpoint has no model.embed_tokens.weight)")
    fam = family(spec)
    for name, (stored, lo, hi) in getattr(fam, "weight_sources", lambda s: {})(spec).items():
        if name not in ck and stored in ck:
            ck.derive(name, stored, lo, hi)
    for name, fn in getattr(fam, "weight_transforms", lambda s: {})(spec).items():
        ck.transform(name, fn)
    for name, shape in fam.weight_shapes(spec).items():
        if name not in ck:
            raise ModelLoadError(f"weight '{name}' is missing from the checkpoint in {d} ({spec.arch})")
        got = tuple(ck.entry(name)["shape"])
        if got != shape:
            raise ModelLoadError(f"weight '{name}' has shape {got}, config.json implies {shape}: config and weights "
                                 "do not belong together")
        ck.check_readable(name)
    return spec, ck, d

"""Model definitions: HF config -> ModelSpec (registry), checkpoint reading, forward passes per family."""
from __future__ import annotations

from types import ModuleType

from .spec import ModelSpec


def family(spec: ModelSpec) -> ModuleType:
    """The module holding body()/head()/weight_shapes() for this spec's forward-pass family."""
    from . import bitnet, llama

    return {"llama": llama, "bitnet": bitnet}[spec.family]


def load_checkpoint(model: str):
    """(spec, checkpoint, model_dir) of a local dir or hub id, with every weight's presence and shape checked."""
    from ..errors import ModelLoadError
    from .checkpoint import Checkpoint, read_config, resolve_model_dir
    from .registry import spec_from_config

    d = resolve_model_dir(model)
    spec = spec_from_config(read_config(d))
    ck = Checkpoint(d)
    for name, shape in family(spec).weight_shapes(spec).items():
        if name not in ck:
            raise ModelLoadError(f"weight '{name}' is missing from the checkpoint in {d} ({spec.arch})")
        got = tuple(ck._where[name].entries[name]["shape"])
        if got != shape:
            raise ModelLoadError(f"weight '{name}' has shape {got}, config.json implies {shape}: config and weights "
                                 "do not belong together")
    return spec, ck, d

"""Target registry: --target name -> TVM target, toolchain, kernel flavour, run-time CPU features."""
from .registry import Target, check_toolchain, get_target, list_targets, short_prefill_chunk

__all__ = ["Target", "get_target", "list_targets", "check_toolchain", "short_prefill_chunk"]

"""Target registry: --target name -> TVM target, toolchain, kernel flavour, run-time CPU features."""
from .registry import Target, check_toolchain, get_target, list_targets

__all__ = ["Target", "get_target", "list_targets", "check_toolchain"]

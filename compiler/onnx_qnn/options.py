"""The android-npu compile options (--npu-*, --soc), checked together: they apply to NPU targets only and some
only in combination."""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import CompileError

NPU_CHUNK = 128   # android-npu prefill chunk: the HTP runs one static shape; 128 rows keep its matmuls busy


@dataclass(frozen=True)
class NpuOptions:
    chunk: int
    quant: str          # w8a16 | w4a16 | w4a16-mixed
    socs: tuple         # the SoCs to prepare EPContext binaries for
    outliers: bool      # int16 activations: outlier channels on the CPU
    weights: str        # rtn | gptq
    residual: str       # int4 | off (w8a16's int4 residual correction)
    act: str            # f16 | int16


def npu_options(tgt, chunk=None, quant="w8a16", soc=None, outliers=False, weights="rtn", residual=None,
                act=None) -> NpuOptions | None:
    """The checked NPU options of an NPU target (defaults filled in), None for other targets; a CompileError names
    the first wrong one."""
    if not tgt.npu:
        if chunk is not None or soc is not None or quant != "w8a16" or outliers or weights != "rtn" or \
                residual is not None or act is not None:
            raise CompileError(f"--npu-chunk, --npu-quant, --npu-act, --npu-weights, --npu-residual, --npu-outliers "
                               f"and --soc apply to --target android-npu, not {tgt.name}")
        return None
    from .package import NPU_ACTS, NPU_WEIGHTS, parse_socs
    from .quantize import NPU_QUANTS

    socs = parse_socs(soc)
    if quant not in NPU_QUANTS:
        raise CompileError(f"--npu-quant {quant} is not supported (choose one of {', '.join(NPU_QUANTS)})")
    if residual not in (None, "int4", "off") or (residual == "int4" and quant != "w8a16"):
        raise CompileError(f"--npu-residual {residual}: choose int4 or off (int4 applies to --npu-quant w8a16)")
    act = act or "f16"
    if act not in NPU_ACTS:
        raise CompileError(f"--npu-act {act}: choose {' or '.join(NPU_ACTS)}")
    if weights not in NPU_WEIGHTS or (weights != "rtn" and quant != "w8a16" and act != "f16"):
        raise CompileError(f"--npu-weights {weights}: choose {' or '.join(NPU_WEIGHTS)} (gptq applies to "
                           "--npu-quant w8a16, and to w4a16 with --npu-act f16)")
    if outliers and act != "int16":
        raise CompileError("--npu-outliers applies to --npu-act int16 (float16 activations need no outlier split)")
    if quant == "w4a16-mixed" and act != "f16":
        raise CompileError("--npu-quant w4a16-mixed applies to --npu-act f16")
    return NpuOptions(chunk or NPU_CHUNK, quant, tuple(socs), bool(outliers), weights,
                      residual or ("int4" if quant == "w8a16" else "off"), act)

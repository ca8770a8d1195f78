"""ONNX Runtime sessions for the NPU prefill graphs: the QNN execution provider (Hexagon HTP; on x86 the emulator
that the onnxruntime-qnn wheel ships) with CPU fallback disabled, or the CPU EP (float reference, calibration).

For the compiler (calibration, error tables, EPContext preparation) and the tests; the C runtime's QNN backend
(runtime/backends/backend_qnn_ort.c) makes its own sessions. Imports onnxruntime lazily, never TVM."""
from __future__ import annotations

import json
import os
import threading

from ...errors import PackageError

# The SoCs the compiler prepares EPContext binaries for: name -> (QNN htp_arch, QNN soc_model).
SOCS = {"sm8550": ("73", "43"), "sm8650": ("75", "57"), "sm8750": ("79", "69")}
DEFAULT_SOCS = ("sm8550", "sm8650", "sm8750")
_lock = threading.Lock()
_registered = False


def _ort():
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise PackageError("the NPU path needs onnxruntime: pip install onnxruntime onnxruntime-qnn") from e
    return ort


def qnn_available() -> bool:
    try:
        import onnxruntime_qnn  # noqa: F401
    except ImportError:
        return False
    return True


def _qnn_devices():
    global _registered
    ort = _ort()
    try:
        import onnxruntime_qnn as oq
    except ImportError as e:
        raise PackageError("the NPU path needs the QNN execution provider: pip install onnxruntime-qnn") from e
    with _lock:
        if not _registered:
            ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
            _registered = True
    devs = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devs:
        raise PackageError("onnxruntime-qnn is installed but ONNX Runtime lists no QNN device")
    return devs, oq


def qnn_options(soc: str | None) -> dict:
    """QNN provider options of a SoC (None: the library's default HTP)."""
    ort_opts = {}
    if soc is not None:
        arch, model = SOCS[soc]
        ort_opts = {"htp_arch": arch, "soc_model": model}
    return ort_opts


def session(path, backend: str = "qnn", soc: str | None = "sm8650", threads: int | None = None,
            config: dict | None = None, profile: str | None = None):
    """An InferenceSession of one graph. backend "qnn": every node on the HTP or an error (no silent CPU fallback);
    "cpu": the CPU EP (float graphs, QDQ simulation)."""
    ort = _ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    if backend == "cpu":
        # the CPU EP fuses a block-wise DequantizeLinear -> MatMul into MatMulNBits, which by default rounds the
        # activations to int8 (accuracy level 4): on a real 135M model that tripled the error of the QDQ graphs it
        # is meant to simulate (1.3% -> 3.6%). Level 0 keeps the fused kernel's activations in float.
        if "session.qdq_matmulnbits_accuracy_level" not in (config or {}):
            so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
        return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    devs, oq = _qnn_devices()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devs, {"backend_path": oq.get_qnn_htp_path(), **qnn_options(soc)})
    return ort.InferenceSession(str(path), sess_options=so)


def placement(sess, feeds) -> dict[str, list[str]]:
    """Runs once with profiling on (the session must have been made with profile=...): {provider: [op names]}."""
    sess.run(None, feeds)
    fn = sess.end_profiling()
    try:
        events = json.load(open(fn))
    finally:
        os.remove(fn)
    out: dict[str, list[str]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            a = e.get("args", {})
            out.setdefault(a.get("provider"), []).append(a.get("op_name"))
    return out

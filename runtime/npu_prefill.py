"""The NPU prefill path of an android-npu package, in Python over ONNX Runtime: the package's npu/ graphs (the
EPContext binary of the chosen SoC when the package has one, else the QDQ ONNX graphs) run in fixed chunks, the
embedding rows and the final norm + lm_head come from the package's own weights on the CPU.

Here it runs on the HTP emulator of the onnxruntime-qnn wheel (correctness and placement; its timings are not speed
numbers). The tests and bench/npu_prefill.py use it; the C runtime's QNN backend is the product path."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import PackageError
from . import qnn_ort
from .contract import MANIFEST, WEIGHTS
from .npu_chunks import ChunkRunner, Group


class NpuPrefill:
    def __init__(self, pkg, soc: str | None = "sm8650", backend: str = "qnn", epcontext: bool = True,
                 profile: str | None = None):
        from ..models.spec import ModelSpec

        self.pkg = Path(pkg)
        try:
            self.manifest = json.loads((self.pkg / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise PackageError(f"{self.pkg} is not a readable package: {e}") from e
        self.npu = self.manifest.get("npu")
        if not self.npu:
            raise PackageError(f"{self.pkg} has no NPU graphs: compile it with --target android-npu")
        self.spec = ModelSpec.from_dict(self.manifest["model"]["config"])
        self.chunk, self.kv_rows = self.npu["chunk"], self.npu["kv_rows"]
        socs = self.npu.get("socs", {})
        self.epcontext = bool(epcontext and soc in socs)
        graphs = socs[soc]["graphs"] if self.epcontext else [g["graph"] for g in self.npu["groups"]]
        self.groups = []
        for path, g in zip(graphs, self.npu["groups"]):
            s = qnn_ort.session(self.pkg / path, backend=backend, soc=soc, profile=profile)
            self.groups.append(Group(tuple(g["layers"]), s, tuple(i.name for i in s.get_inputs())))
        self._tensors = {t["name"]: t for t in self.manifest["tensors"]}
        self._mats: dict[str, np.ndarray] = {}

    # ---------------------------------------------------------------- the package's CPU-side weights
    def _tensor(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        raw = np.memmap(self.pkg / WEIGHTS, np.uint8, "r", offset=t["offset"], shape=(t["nbytes"],))
        return np.frombuffer(raw, np.dtype(t["dtype"])).reshape(t["shape"])

    def matrix(self, name: str) -> np.ndarray:
        """A float32 matrix of the package (dequantized from the head scheme it is stored in)."""
        if name not in self._mats:
            from ..quant import get_scheme

            scheme = get_scheme(self.manifest["quant"]["head"])
            if scheme.part_order == ("w",):
                m = self._tensor(name)
            else:
                m = scheme.dequantize({p: self._tensor(f"{name}.{p}") for p in scheme.part_order})
            self._mats[name] = np.asarray(m, np.float32).reshape(self.spec.vocab_size, self.spec.hidden_size)
        return self._mats[name]

    def logits(self, h: np.ndarray) -> np.ndarray:
        """Final RMSNorm + lm_head of hidden rows [T, hidden] (float32 numpy, on the CPU)."""
        w = self._tensor("model.norm.weight").astype(np.float32)
        x = h.astype(np.float32)
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.spec.rms_eps) * w
        return x @ self.matrix(self.spec.lm_head_name).T

    # ---------------------------------------------------------------- prefill
    def prefill(self, ids, runner: ChunkRunner | None = None) -> tuple[np.ndarray, ChunkRunner]:
        """Hidden states [len(ids), hidden] of a prompt prefilled in chunks on the NPU graphs, and the runner that
        holds the KV cache it filled (pass it again to append)."""
        ids = np.asarray(ids, np.int64)
        if ids.ndim != 1 or len(ids) == 0 or ids.min() < 0 or ids.max() >= self.spec.vocab_size:
            raise PackageError(f"token ids must be 1..n ids in 0..{self.spec.vocab_size - 1}")
        runner = runner or ChunkRunner(self.spec, self.groups, self.chunk, self.kv_rows)
        if runner.pos + len(ids) > self.manifest["max_context"]:
            raise PackageError(f"{runner.pos + len(ids)} tokens exceed the package's context "
                               f"({self.manifest['max_context']})")
        return runner.prefill(self.matrix("model.embed_tokens.weight")[ids]), runner

r"""GPTQ for the q4 schemes (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"), pure numpy.

One linear layer y = x W^T, W [N, K], calibration inputs X [n, K], H = 2 X^T X / n. The columns of W are
quantized one at a time (in blocks of 128 with lazy batch updates); the error of each column, divided by the
diagonal of the upper Cholesky factor U of H^-1 (H^-1 = U^T U), is spread over the not yet quantized columns
(W[:, j] -= err * U[i, j]), which minimizes ||X W^T - X Wq^T|| greedily. Dampening: H += 0.01 * mean(diag H) I;
dead inputs (diag H = 0: a channel that is always zero in the calibration data) get H_ii = 1 and W[:, i] = 0.

The output is exactly our q4 format (quant/q4.py): codes q in -8..7, one f16 scale per (row, group of G
contiguous k in the ORIGINAL column order), with the same scale rule as RTN (q4.q4_scales: d = m / -8, m the
signed absmax of the group). Scales are rounded to f16 before the codes of their group are computed, so the codes
are optimal against the scale that is stored.

  * act_order=False: the group scale is computed when the quantization reaches the group's first column, from
    the error-updated weights of the group (as the reference; we take them from the current block, which holds
    every update so far).
  * act_order=True: columns are processed by descending diag(H) ("desc_act"). Since our groups are contiguous in
    the original order, the scales are "static groups" (AutoGPTQ static_groups=True): computed up front from the
    original W, then every column is quantized against its own group's scale in act order. No g_idx is needed.

With H = I (no correlation to exploit) every compensation term is zero and GPTQ returns exactly RTN's codes and
scales (quantize_q4); tests/test_gptq.py checks that.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from .q4 import pack_q4, q4_codes, q4_scales


@dataclass(frozen=True)
class Grid:
    """A symmetric integer grid GPTQ rounds onto: scales(groups f32 [..., G]) -> one scale per group (exactly the
    stored value), codes(w, d) -> the integer codes of w against d (0 where d == 0)."""
    scales: Callable[[np.ndarray], np.ndarray]
    codes: Callable[[np.ndarray, np.ndarray], np.ndarray]


Q4_GRID = Grid(q4_scales, q4_codes)


def _int8_scales(wg: np.ndarray) -> np.ndarray:
    return (np.abs(np.asarray(wg, np.float32)).max(axis=-1) / np.float32(127)).astype(np.float32)


def _int8_codes(w: np.ndarray, d: np.ndarray) -> np.ndarray:
    w, d = np.asarray(w, np.float32), np.asarray(d, np.float32)
    q = np.clip(np.rint(w / np.where(d != 0, d, np.float32(1))), -127, 127)
    return np.where(d != 0, q, 0).astype(np.int8)


INT8_GRID = Grid(_int8_scales, _int8_codes)   # symmetric int8 (-127..127), f32 scales: the NPU graphs' weights


def _hinv_upper(H: np.ndarray, percdamp: float) -> np.ndarray:
    """Upper Cholesky factor U of (H + damp I)^-1 (= U^T U), float64, with one Cholesky: with J the reversal
    permutation, J H J = L L^T gives H = V V^T with V = J L J upper triangular, so H^-1 = (V^-1)^T V^-1 and
    V^-1 (upper, positive diagonal) is U. The dampening grows x10 (up to 4 times) if H + damp I is still not
    numerically positive definite."""
    K = H.shape[0]
    mean_diag = float(np.mean(np.diag(H)))
    damp = percdamp * mean_diag if mean_diag > 0 else 1.0
    eye = np.eye(K)
    for _ in range(5):
        try:
            L = np.linalg.cholesky((H + damp * eye)[::-1, ::-1])
            U = np.triu(np.linalg.inv(L[::-1, ::-1]))
            if np.all(np.isfinite(U)):
                return U
        except np.linalg.LinAlgError:
            pass
        damp *= 10
    raise np.linalg.LinAlgError("GPTQ: the Hessian is not positive definite even with dampening")


@dataclass
class PreparedHessian:
    """What GPTQ needs from a Hessian, computed once and shared by every linear that reads the same input
    (q/k/v, gate/up): dead inputs, the act-order permutation (or None) and U = chol(H^-1) upper, f32."""
    dead: np.ndarray
    perm: np.ndarray | None
    hinv: np.ndarray


def prepare_hessian(H: np.ndarray, act_order: bool = False, percdamp: float = 0.01) -> PreparedHessian:
    """H [K, K] (2 X^T X / n; any positive multiple works) -> PreparedHessian."""
    H = np.array(H, dtype=np.float64)
    if H.ndim != 2 or H.shape[0] != H.shape[1]:
        raise ValueError(f"GPTQ: H must be square, got {H.shape}")
    dead = np.diag(H) == 0
    H[dead, dead] = 1.0
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else None
    if perm is not None:
        H = H[perm][:, perm]
    return PreparedHessian(dead, perm, _hinv_upper(H, percdamp).astype(np.float32))


def gptq_quantize(w: np.ndarray, H: np.ndarray | PreparedHessian, group: int, act_order: bool = False,
                  block: int = 128, percdamp: float = 0.01, grid: Grid = Q4_GRID,
                  scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ of one weight matrix for q4 (or another `grid`) with group size `group` (K: one scale per row).

    w f32 [N, K]; H [K, K] the Hessian 2 X^T X / n of the layer inputs (a positive multiple is fine), or a
    PreparedHessian (then act_order and percdamp are the ones it was prepared with).
    scales: [N, K/group] fixed up front by the caller (static groups; e.g. fitted together with per-group offsets
    that the caller subtracted from w), else the grid's, from the weights as GPTQ reaches each group.
    Returns (q int8 [N, K] in -8..7, scales f32 [N, K/group], every scale an exact f16 value);
    dequantized weight = q * scales repeated over each group; pack_q4(q, scales) gives the q4 parts."""
    W = np.array(w, dtype=np.float32)                      # working copy, updated in place
    N, K = W.shape
    G = int(group)
    if G <= 0 or K % G:
        raise ValueError(f"GPTQ: K={K} is not a multiple of the group size {G}")
    P = H if isinstance(H, PreparedHessian) else prepare_hessian(H, act_order, percdamp)
    if P.hinv.shape != (K, K):
        raise ValueError(f"GPTQ: H has shape {P.hinv.shape}, expected {(K, K)}")
    perm, Hinv = P.perm, P.hinv
    W[:, P.dead] = 0.0

    Q = np.zeros((N, K), np.int8)
    S = np.zeros((N, K // G), np.float32)
    static = perm is not None or G > int(block) or scales is not None   # (a group wider than a block: per-row scales)
    if static:   # static groups, original order
        S[:] = scales if scales is not None else grid.scales(W.reshape(N, K // G, G)).astype(np.float32)
        if perm is not None:
            W = W[:, perm]
        bs = max(1, int(block))
    else:
        bs = max(G, int(block) // G * G)                   # whole groups per block: scales come from the block

    d = np.zeros(N, np.float32)
    for i1 in range(0, K, bs):
        i2 = min(i1 + bs, K)
        W1 = W[:, i1:i2].copy()
        Err1 = np.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if static:
                d = S[:, (perm[col] if perm is not None else col) // G]
            elif col % G == 0:
                d = grid.scales(W1[:, i:i + G]).astype(np.float32)
                S[:, col // G] = d
            w_col = W1[:, i]
            q = grid.codes(w_col, d)
            Q[:, col] = q
            err = (w_col - q.astype(np.float32) * d) / Hinv1[i, i]
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            Err1[:, i] = err
        if i2 < K:
            W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    if perm is not None:
        Q = Q[:, np.argsort(perm)]
    return Q, S


def gptq_q4_parts(w: np.ndarray, H: np.ndarray, group: int, act_order: bool = False, block: int = 128,
                  percdamp: float = 0.01) -> dict[str, np.ndarray]:
    """GPTQ of one matrix straight to the q4 parts {"qweight", "scales"} (the layout of q4.quantize_q4)."""
    return pack_q4(*gptq_quantize(w, H, group, act_order=act_order, block=block, percdamp=percdamp))


def dequantize(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(q [N, K], scales [N, K/G]) -> f32 [N, K]."""
    N, K = q.shape
    G = K // scales.shape[1]
    return (q.astype(np.float32).reshape(N, K // G, G) * np.asarray(scales, np.float32)[..., None]).reshape(N, K)

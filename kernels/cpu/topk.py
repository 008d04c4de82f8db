"""Top-k on the CPU: selection over one long row, and the output-head logits of rows that only
need their top-k.

`topk`: `torch.topk` on a 151,936-entry logit row takes ~0.3-0.6 ms on this project's 2-core
machine; finding the k-th largest value from chunk maxima and partitioning only what lies above
it takes ~0.05 ms.

`topk_logits`: a first pass over an int8 copy of the float output head (`gemv.pack_i8`, a quarter
of the float32 bytes) with the activations quantized to int8 too, exact integer dot products
(`gemv.head_scan_i8`; AVX2 maddubs: the 151,936 x 256 head of the lesson model ~3.5 ms at 1 row,
~4 ms at 4 on one core of this project's AMD EPYC), then an exact float32 recompute of the few
candidates that can be among the top-k (`first_pass` gives the error bound that selects them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..qweight import QWeight
from . import gemv
from .matmul import qmatmul


def kth_largest(r: np.ndarray, k: int) -> float:
    """The k-th largest value of r [V] (1 <= k <= V, no NaN). The k largest maxima of >= k chunks
    are k distinct elements, so the k-th largest of r is at least the k-th largest chunk maximum;
    only the elements at or above that are partitioned."""
    n = r.size
    if k == 1:
        return float(r.max())
    n_chunks = max(4 * k, 256)
    size = n // n_chunks
    if size < 4:
        return float(np.partition(r, n - k)[n - k])
    maxima = r[: n_chunks * size].reshape(n_chunks, size).max(axis=1)
    if n_chunks * size < n:
        maxima = np.append(maxima, r[n_chunks * size:].max())
    t0 = np.partition(maxima, maxima.size - k)[maxima.size - k]
    above = r[r >= t0]  # holds the k largest of r
    return float(np.partition(above, above.size - k)[above.size - k])


def topk(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries of a CPU float32 row [V], values descending;
    equal values keep ascending indices. Same contract as torch.topk(row, k); rows holding NaN go
    to torch.topk, and so do rows of other dtypes."""
    if row.dtype != torch.float32:
        return torch.topk(row, k)
    r = row.numpy()
    if np.isnan(r).any():
        return torch.topk(row, k)
    kth = kth_largest(r, k)
    idx = np.flatnonzero(r >= kth)  # >= k entries, ascending
    order = np.argsort(-r[idx], kind="stable")[:k]
    idx = torch.from_numpy(idx[order])
    return row[idx], idx


@dataclass
class TopkHead:
    """An int8 copy of a float output head (`gemv.interleave_i8` tiles, row scales), with what
    bounds its error: every row r satisfies |w_r| <= w_max and |w_r - scale_r q_r| <= e_max."""
    q4: torch.Tensor  # int8 [nt, K4 / 4, 64, 4]
    scale: torch.Tensor  # float32 row scales [nt * 64]
    w_max: float
    e_max: float


def prepare_topk_head(w: QWeight) -> TopkHead | None:
    """For a float head in 64-row tiles where the C kernels are a vector build (else None)."""
    if w.data.device.type != "cpu" or w.layout != "tiles64" or not gemv.i8_fast():
        return None
    q, scale, err, norm = gemv.pack_i8(w.data)
    return TopkHead(gemv.interleave_i8(q), scale, float(norm.max()), float(err.max()))


def first_pass(x: torch.Tensor, head: TopkHead, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(a [M, V], b [M]): approximate logits of the rows of x [M, K] float32 and a bound,
    |a[m, r] - x[m] . w_r| <= b[m] for every r. x is quantized to int8 per row (x = sx qx + ex) and
    a = ((float)(qx . q_r) sx) scale_r, the dot product exact in int32; so
    x . w_r - a = ex . w_r + sx qx . (w_r - scale_r q_r) + (rounding of the two float32 products,
    relative 3 2^-24 each way), bounded by |ex| w_max + |sx qx| (e_max + 2^-22 (w_max + e_max))."""
    K4 = head.q4.shape[1] * 4
    qx, sx = gemv.quantize_rows(x, K4)
    a = gemv.head_scan_i8(qx, sx, head.q4, head.scale, n_rows).numpy()
    xq = qx[:, :x.shape[1]].double() * sx.double()[:, None]
    ex = (x.double() - xq).norm(dim=1).numpy()
    nq = xq.norm(dim=1).numpy()
    b = (ex * head.w_max + nq * (head.e_max + 2.0 ** -22 * (head.w_max + head.e_max))) * (1 + 1e-6)
    return a, b


def topk_logits(x: torch.Tensor, w: QWeight, head: TopkHead | None, topk: list[int],
                banned: list[tuple[int, ...]]) -> torch.Tensor:
    """The contract of `kernels.ref.topk_logits`: rows with topk 0 exact everywhere (`qmatmul`);
    the others exact at their candidates and -inf elsewhere. A row can be among the top-k only if
    its first-pass value a_r + b reaches the k-th largest a - b (`first_pass`); those candidates
    (typically a handful of the 151,936) are recomputed exactly in float32 from the file's
    weights."""
    if head is None or all(k <= 0 for k in topk):
        return qmatmul(x, w).float()
    V = w.rows
    exact = [i for i, k in enumerate(topk) if k <= 0]
    approx = [i for i, k in enumerate(topk) if k > 0]
    # numpy for the [rows, V] fill: a torch fill that large is an OpenMP region, and on a loaded
    # host its barrier can cost more than the whole first pass
    out = np.full((x.shape[0], V), -np.inf, dtype=np.float32)
    if exact:
        out[exact] = qmatmul(x[exact], w).float().numpy()
    xa = x[approx].float()
    xn = xa.numpy()
    first, bound = first_pass(xa, head, V)
    for j, i in enumerate(approx):
        r = first[j]
        if banned[i]:
            r[list(banned[i])] = -np.inf
        kth = kth_largest(r, min(topk[i], V))
        cand = np.flatnonzero(r >= kth - 2 * bound[j])
        # the file's weights, float32 dot products in numpy (a torch matmul is a BLAS call that
        # may fork threads, as costly as the fill above on a loaded host)
        out[i, cand] = gemv.rows(w.data, torch.from_numpy(cand)).float().numpy() @ xn[j]
    return torch.from_numpy(out)

"""Weights on the CPU: the layout `prepare_weight` gives each matrix once at load, and the
`qmatmul` / `dequantize` / `embedding` ops over every layout (docs/DESIGN.md; layouts in
`kernels.qweight`).

- quantized weights: the integer-dot panels of `qdot.py` ("x8": the GGUF bits regrouped, same
  size, activations quantized to 8 bits per block, int32 dots) for every type it has (Q4_0 ... Q8_0,
  Q2_K ... Q6_K); the weights that read one input (q/k/v, gate/up) prepared together by
  `prepare_weights` into one "x8" group (one call, the input quantized once); a mapped source is
  dropped from memory after the repack. Types qdot lacks: the exact affine-integer tiles of
  `qgemv.py` ("tiles64_c8" / "tiles64_c4", float32 math) when its vectorized C kernel exists; else
  dequantized once ("unpack_quantized") and treated as float weights, or else kept in GGUF blocks
  ("rows", dequantized on every matmul);
- float weights of at least 2^16 elements: 64-row tiles for the batched GEMV of `gemv.py`
  ("tiles64", with a vector build of the C kernels; float16/bfloat16 stay in their type);
- the others: float32 [cols, rows] ("cols"), what BLAS reads fastest for small batches.
Without the C kernels the BLAS layouts are used. GGUF "rows" weights go to `kernels.ref`.
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType

from .. import ref
from ..numerics import Numerics
from ..qweight import QWeight
from . import gemv, mxfp4, qdot, qgemv

# Weights at least this large (elements) use the batched-GEMV kernel for decode batches.
_BGEMV_MIN_ELEMS = 1 << 16
# Tiled weights smaller than this run the GEMV kernel on one thread.
_BGEMV_MT_MIN_ELEMS = 1 << 20
# Tiled weights up to this size are unpacked for prefill-sized products instead.
_UNPACK_MAX_ELEMS = 1 << 22
# From this many rows on (prefill) a matmul goes to torch's multi-threaded BLAS; below it, numpy's
# OpenBLAS (kept single-threaded by the engine) has less per-call overhead.
_BLAS_MT_MIN_M = 32


def packs_quantized() -> bool:
    """Whether `prepare_weight(pack_quantized=True)` repacks quantized weights for a C kernel
    (integer-dot panels, or else the float-affine tiles where their vectorized kernel exists)."""
    return qdot.available() or qgemv.available()


def _qdot_supports(w: QWeight) -> bool:
    """A GGUF-layout quantized weight on the CPU of a type (and width) qdot takes."""
    return (w.layout == "rows" and not w.is_float and w.data.device.type == "cpu"
            and qdot.groupable([(w.qtype, w.cols)]))


def _qdot_pack(ws: list[QWeight], numerics: Numerics) -> QWeight:
    """Weights reading the same input -> one "x8" weight: their panels side by side in one buffer,
    one `qdot.QdotGroup` over them, computing in `numerics`: the panels `kernels.prepack_quantized`
    made of exactly this group when the weights carry them, else repacked now (mapped sources
    dropped from memory)."""
    sizes = [qdot.repacked_bytes(int(w.qtype), w.rows, w.cols) for w in ws]
    buf = _prepacked(ws, sizes)
    fresh = buf is None
    if fresh:
        buf = torch.empty(sum(sizes), dtype=torch.uint8)
    members, off = [], 0
    for w, n in zip(ws, sizes):
        if fresh:
            members.append(qdot.prepare(w.data, int(w.qtype), w.rows, w.cols, release_source=w.mapped,
                                        out=buf[off:off + n]))
        else:
            members.append(qdot.QdotWeight(buf[off:off + n], int(w.qtype), w.rows, w.cols))
        off += n
    g = qdot.group(members, numerics.qdot_exact)
    return QWeight(buf, ws[0].qtype, g.rows, ws[0].cols, "x8", kernel=g)


def _prepacked(ws: list[QWeight], sizes: list[int]) -> torch.Tensor | None:
    """The buffer of the panels `kernels.prepack_quantized` made of exactly this group
    (`QWeight.repacked`: one buffer, the members in order at their offsets, same types and
    shapes), else None."""
    pre = [w.repacked for w in ws]
    if any(p is None for p in pre) or any(p.buf is not pre[0].buf or p.size != len(ws) for p in pre):
        return None
    offsets = [sum(sizes[:i]) for i in range(len(ws))]
    if any((p.index, p.offset, p.qtype, p.rows, p.cols, p.nbytes) != (i, o, int(w.qtype), w.rows, w.cols, n)
           for i, (p, w, n, o) in enumerate(zip(pre, ws, sizes, offsets))) or pre[0].buf.nbytes != sum(sizes):
        return None
    return torch.from_numpy(pre[0].buf)


def prepare_weights(ws: list[QWeight], unpack_quantized: bool = False, pack_quantized: bool = True,
                    numerics: Numerics = Numerics.GGML) -> list[QWeight]:
    """Once at load, weights that read the same input (q/k/v, gate/up): one "x8" group when qdot
    has all their types (its matmuls in `numerics`, fixed here), else `ref.cat_rows` (one matrix
    where they share a type) and `prepare_weight` each. Concatenating the `qmatmul` outputs of the
    result along dim 1 gives x @ [W_0; W_1; ...]^T."""
    if (pack_quantized and all(map(_qdot_supports, ws)) and qdot.groupable([(w.qtype, w.cols) for w in ws])
            and qdot.available()):
        return [_qdot_pack(ws, numerics)]
    return [prepare_weight(w, unpack_quantized, pack_quantized, numerics) for w in ref.cat_rows(ws)]


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True,
                   numerics: Numerics = Numerics.GGML) -> QWeight:
    """Once at load, the layout of the module docstring (a qdot group's matmuls in `numerics`).
    Weights not on the CPU are returned as they are."""
    if w.layout != "rows" or w.data.device.type != "cpu":
        return w
    if mxfp4.supported(w):  # stays in its blocks: mxfp4.c reads them in llama.cpp's order
        return w
    if pack_quantized and _qdot_supports(w) and qdot.available():
        return _qdot_pack([w], numerics)
    if not w.is_float and pack_quantized and qgemv.supports(w) and qgemv.available():
        return qgemv.pack(w)
    if not w.is_float:
        if not unpack_quantized:
            return w
        w = QWeight.from_float(ref.dequantize(w, torch.float32))
    if w.rows * w.cols >= _BGEMV_MIN_ELEMS and gemv.vectorized():
        # float16 / bfloat16 stay in their type (half the bytes per step; widened exactly in C)
        keep = w.data.dtype in (torch.float16, torch.bfloat16)
        data = w.data if keep else w.data.float()
        qtype = w.qtype if keep else GGMLQuantizationType.F32
        return QWeight(gemv.pack(data), qtype, w.rows, w.cols, "tiles64")
    return QWeight(w.data.T.to(torch.float32).contiguous(), GGMLQuantizationType.F32, w.rows, w.cols, "cols")


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, cols] matrix of `w` in `dtype`."""
    if w.layout == "x8":
        return torch.cat([qdot.dequantize_rows(m) for m in w.kernel.weights]).to(dtype)
    if w.layout in qgemv.LAYOUTS:
        return qgemv.unpack(w).to(dtype)
    if w.layout == "tiles64":
        return gemv.unpack(w.data, w.rows).to(dtype)
    if w.layout == "cols":
        return w.data.T.to(dtype)
    return ref.dequantize(w, dtype)


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[T, rows] = x[T, cols] @ W^T, output dtype = x.dtype."""
    if w.layout == "x8":  # activations quantized per block inside the call, int32 dots
        return qdot.matmul_group(x, w.kernel).to(x.dtype)
    if w.qtype == mxfp4.MXFP4 and w.layout == "rows":  # q8_0 activations, LUT integer dots (mxfp4.c)
        return mxfp4.qmatmul(x, w)
    if w.layout in qgemv.LAYOUTS:  # any T: the kernel beats BLAS on dequantized rows here
        nt = 1 if x.shape[0] <= gemv.MAX_M and w.rows * w.cols < _BGEMV_MT_MIN_ELEMS else None
        return qgemv.qgemv(x.float(), w, nt).to(x.dtype)
    if w.layout == "tiles64":  # one pass over the weights per 16 rows of x
        if x.shape[0] > gemv.MAX_M and w.rows * w.cols <= _UNPACK_MAX_ELEMS:
            # prefill through a small matrix: unpacking it (a ~1 MB copy) and one multi-threaded
            # BLAS call beats many passes of the GEMV kernel
            return x @ gemv.unpack(w.data, w.rows).T.to(x.dtype)
        # small matrices on one thread: an OpenMP fork per layer matmul costs more than it saves,
        # and idle workers spinning on both cores starve the HTTP thread
        nt = 1 if w.rows * w.cols < _BGEMV_MT_MIN_ELEMS else None
        return gemv.bgemv(x.float(), w.data, w.rows, nt).to(x.dtype)  # all rows in one pass
    if w.layout == "cols":
        if x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] < _BLAS_MT_MIN_M:
            # numpy's BLAS (OpenBLAS) beats torch's MKL sgemm on small-M, large-N products on
            # AMD cores by 2-3x; both run in float32 with the same accumulation order per row
            return torch.from_numpy(np.matmul(x.contiguous().numpy(), w.data.numpy()))
        return x @ w.data.to(x.dtype)
    if w.is_float and x.device.type == "cpu" and x.dtype == torch.float32 and w.data.dtype == torch.float32:
        if x.shape[0] < _BLAS_MT_MIN_M:
            return torch.from_numpy(np.matmul(x.contiguous().numpy(), w.data.numpy().T))
    return ref.qmatmul(x, w)


def embedding(ids: torch.Tensor, w: QWeight) -> torch.Tensor:
    """[T, cols] float32 rows `ids` of `w` (only the gathered rows are dequantized)."""
    ids = ids.to(device=w.data.device, dtype=torch.long)
    if w.layout == "x8":
        if len(w.kernel.weights) != 1:
            raise ValueError("embedding rows from a group of weights")
        return qdot.dequantize_rows(w.kernel.weights[0], ids)
    if w.layout in qgemv.LAYOUTS:
        return qgemv.rows(w, ids)
    if w.layout == "tiles64":
        return gemv.rows(w.data, ids).float()
    if w.layout == "cols":
        return w.data[:, ids].T.float()
    out = ref.embedding(ids, w)
    if w.mapped and w.data.device.type == "cpu" and qdot.available():
        # the table stays in the file mapping, gathered from in place; a fault maps the 64 KiB around
        # each row (fault-around), so without this a long prompt leaves tens of MB of the table
        # resident. Dropping the pages again is cheap (they stay in the page cache) and keeps the
        # table out of the RSS, as llama.cpp's mmap does not.
        qdot.release_pages(w.data)
    return out

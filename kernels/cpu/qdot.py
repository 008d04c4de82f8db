"""Integer-dot quantized matmul for the CPU path (C sources: kernels/cpu/qdot*.c, layout in qdot.h).

Weights: `prepare` repacks the GGUF blocks of one tensor, once at load, into "x8" panels of 8
output rows holding exactly the same bits (same size: < 64 bytes of padding per 8 rows, rows
padded to a multiple of 8): codes grouped so that one u8 x s8 dot instruction yields the 8 rows'
sums in 8 int32 lanes, 4-bit codes kept as nibbles, 5th/6th bits as bit planes, the GGUF scale
fields (fp16 d / dmin, packed 6-bit K-quant scales) 8 rows side by side, each block's scale fields
just before its codes.
The caller then drops the GGUF mapping (or passes release_source=True): no second copy of the
model. Why a repack rather than reading the mapped blocks in place: the interleaved panels need no
horizontal reductions, convert 8 fp16 scales per instruction, read as one sequential stream, and
one decoded-panel format serves decode (one pass over the weights for all batch rows) and the
prefill GEMM; it costs one read + one write of the weights at load (the whole 0.5B model:
0.6-0.9 s of CPU on one thread, `scripts/bench_qdot.py --load`).

Activations are quantized like llama.cpp's CPU backend ("q8_0": per 32, for Q4_0 Q4_1 Q5_0 Q5_1
Q8_0 weights; "q8_K": per 256 with per-16 sums, for the K-quants; `act_kind(qtype)`), int32 dots
(AVX2 vpmaddubsw/vpmaddwd, VNNI vpdpbusd, portable C), float32 scales per block.

Calls:
- `matmul(x, w)`: x float32 [T, cols] -> [T, rows]; quantizes x inside the same C call;
- `group([wq, wk, wv])` once at load + `matmul_group(x, g)`: several weights reading the same input
  (q/k/v, gate/up) in one call: x quantized once (both kinds if the group mixes them), one
  parallel region, threads split by weight bytes; y [T, sum(rows)] in weight order (`g.splits`);
- `quantize_activations(x, kind)` + `matmul(acts, w)`: explicit reuse of quantized activations;
- `dequantize_rows(w, ids)`: rows as float32, bit-identical to kernels.dequant_ref (embeddings).
Up to 8 rows the codes are decoded in registers straight from the panels (decode steps); more rows
decode each group of panels once into L2-resident scratch (prefill GEMM).

ISA: `TRITIUM_CPU_ISA` = avx512vnni | avxvnni | avx2 | scalar (default: the best this CPU has;
"vnni-emu" = the VNNI code paths on AVX2 with an exact emulation of vpdpbusd, for tests on
machines without VNNI). Each ISA is its own build, cached under $TRITIUM_CACHE (~/.cache/tritium)
keyed by a hash of the sources, flags and ISA. The repacked layout is the same for every ISA.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from .qdot_lib import (GROUP_MAX, ISA_FLAGS, TYPES, _GroupStruct, _lib, act_kind, available, build,  # noqa: F401
                       current_isa, groupable, lib, library, repacked_bytes, supported_isas)


def _threads(n: int | None) -> int:
    return int(n) if n else torch.get_num_threads()


@dataclass
class QdotWeight:
    """One repacked weight: `data` uint8 [repacked_bytes] (x8 panels), `qtype` the GGML type id,
    `rows` output features, `cols` input features."""
    data: torch.Tensor
    qtype: int
    rows: int
    cols: int
    _group: "QdotGroup | None" = None

    @property
    def act_kind(self) -> str:
        return act_kind(self.qtype)

    @property
    def nbytes(self) -> int:
        return self.data.numel()


@dataclass
class QActs:
    """Quantized activation rows: q int8 [M, K]; d float32 [M, K / block]; sums int32 [M, K / 32]
    (q8_0: the sum of each block's codes) or int16 [M, K / 16] (q8_K: bsums); q8_0 also s1 float32
    [M, K / 32], llama.cpp's q8_1 `s` (fp16 of d * sum, for Q4_1 / Q5_1 in its float order)."""
    kind: str
    q: torch.Tensor
    d: torch.Tensor
    sums: torch.Tensor
    s1: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)


def _as_u8(raw) -> tuple[int, torch.Tensor | np.ndarray]:
    """A pointer to the bytes of `raw` (torch uint8 tensor, numpy array, memmap, bytes-like) and the
    object that keeps them alive."""
    if isinstance(raw, torch.Tensor):
        t = raw.contiguous()
        return t.data_ptr(), t
    a = np.ascontiguousarray(np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw)
    return a.ctypes.data, a


def prepare(raw, qtype: int, rows: int, cols: int, n_threads: int | None = None,
            release_source: bool = False, out: torch.Tensor | None = None) -> QdotWeight:
    """GGUF bytes of one tensor ([rows, cols / block * type_size], any buffer: the numpy view of the
    mapped file is read once, not kept) -> the repacked weight.

    release_source: afterwards drop the source pages from this process (madvise MADV_DONTNEED on
    their page-aligned interior), so that loading a model never holds the mapped file and the
    repacked weights at once (peak RSS ~ one copy). Only for a read-only or never-written
    copy-on-write file mapping: the pages are re-read from the page cache if touched again.
    out: where to write the panels (uint8 [repacked_bytes], contiguous; e.g. a slice of one buffer
    holding a whole group)."""
    qtype = int(qtype)
    if qtype not in TYPES:
        raise NotImplementedError(f"qdot: GGML type {qtype} is not supported")
    bs, ts, _ = TYPES[qtype]
    if cols % bs:
        raise ValueError(f"qdot: cols={cols} is not a multiple of the block size {bs}")
    ptr, keep = _as_u8(raw)
    nbytes = keep.numel() if isinstance(keep, torch.Tensor) else keep.nbytes
    row_bytes = cols // bs * ts
    if nbytes < rows * row_bytes:
        raise ValueError(f"qdot: {nbytes} bytes for {rows} x {cols} of type {qtype} ({rows * row_bytes} needed)")
    n_out = repacked_bytes(qtype, rows, cols)
    if out is None:
        out = torch.empty(n_out, dtype=torch.uint8)
    elif out.dtype != torch.uint8 or out.numel() != n_out or not out.is_contiguous():
        raise ValueError(f"qdot: out must be {n_out} contiguous uint8 bytes")
    if _lib().qd_repack(qtype, ptr, row_bytes, rows, cols, out.data_ptr(), _threads(n_threads)) != 0:
        raise RuntimeError("qdot: repack failed")
    if release_source:
        _lib().qd_release(ptr, rows * row_bytes)
    del keep
    return QdotWeight(out, qtype, rows, cols)


def release_pages(t: torch.Tensor) -> None:
    """Drop the pages of a never-written file-mapped tensor from this process (they are re-read
    from the page cache when touched again)."""
    _lib().qd_release(t.data_ptr(), t.numel() * t.element_size())


def quantize_activations(x: torch.Tensor, kind: str, n_threads: int | None = None) -> QActs:
    """x float32 [M, K] (rows may be strided) -> QActs of `kind` ("q8_0" or "q8_K")."""
    if x.dim() != 2:
        raise ValueError("qdot: activations must be [M, K]")
    if x.dtype != torch.float32 or x.stride(1) != 1:
        x = x.float().contiguous()
    M, K = x.shape
    lb = _lib()
    if kind == "q8_0":
        if K % 32:
            raise ValueError(f"qdot: K={K} is not a multiple of 32")
        q = torch.empty((M, K), dtype=torch.int8)
        d = torch.empty((M, K // 32), dtype=torch.float32)
        s = torch.empty((M, K // 32), dtype=torch.int32)
        s1 = torch.empty((M, K // 32), dtype=torch.float32)
        lb.qd_quantize_q8_0(x.data_ptr(), x.stride(0), M, K, q.data_ptr(), d.data_ptr(), s.data_ptr(), s1.data_ptr(),
                            _threads(n_threads))
        return QActs(kind, q, d, s, s1)
    elif kind == "q8_K":
        if K % 256:
            raise ValueError(f"qdot: K={K} is not a multiple of 256")
        q = torch.empty((M, K), dtype=torch.int8)
        d = torch.empty((M, K // 256), dtype=torch.float32)
        s = torch.empty((M, K // 16), dtype=torch.int16)
        lb.qd_quantize_q8_K(x.data_ptr(), x.stride(0), M, K, q.data_ptr(), d.data_ptr(), s.data_ptr(), _threads(n_threads))
    else:
        raise ValueError(f"qdot: unknown activation kind {kind!r}")
    return QActs(kind, q, d, s)


class QdotGroup:
    """Weights that read the same input (q/k/v, gate/up): `matmul_group` quantizes the input once
    and runs all of them in one call (one parallel region, threads split by weight bytes); the
    outputs are the column blocks of one [T, sum(rows)] tensor, in order. Bound to the ISA build
    current when it is created, and to its numerics: `exact` 1 llama.cpp's float order for the types
    that have it (qdot_exact.c; `Numerics.GGML`, the default), 0 qdot's own (`Numerics.OWN`), 2
    llama.cpp's through the portable reference kernels (tests)."""

    def __init__(self, weights: list[QdotWeight], exact: int = 1):
        if not 1 <= len(weights) <= GROUP_MAX:
            raise ValueError(f"qdot: a group holds 1..{GROUP_MAX} weights")
        K = weights[0].cols
        if any(w.cols != K for w in weights):
            raise ValueError("qdot: the weights of a group must have the same number of columns")
        self.weights = list(weights)
        self.K = K
        self.rows = sum(w.rows for w in weights)
        self.splits = [w.rows for w in weights]
        st = _GroupStruct()
        st.nw, st.K = len(weights), K
        st.exact = _exact(exact)
        for i, w in enumerate(weights):
            st.types[i], st.Ns[i], st.Ws[i] = w.qtype, w.rows, w.data.data_ptr()
        self._struct = st
        self._ptr = ctypes.addressof(st)
        self._fn = _lib().qd_group_run


def group(weights: list[QdotWeight], exact: int = 1) -> QdotGroup:
    return QdotGroup(weights, exact)


def _exact(exact: int) -> int:
    if int(exact) not in (0, 1, 2):
        raise ValueError(f"qdot: exact must be 0, 1 or 2, not {exact!r}")
    return int(exact)


def matmul_group(x: torch.Tensor, g: QdotGroup, out: torch.Tensor | None = None,
                 n_threads: int | None = None, exact: int | None = None) -> torch.Tensor:
    """x float32 [T, K] (rows may be strided) -> y float32 [T, sum(rows)]; `out` may be given
    (float32 [T, sum(rows)], unit column stride). `exact`: 1 llama.cpp's float order for the types
    that have it (qdot_exact.c), 2 the same through its portable reference, 0 qdot's own order;
    default the group's (fixed when it was made)."""
    if x.dtype is not torch.float32 or x.stride(-1) != 1:
        x = x.float().contiguous()
    M, K = x.shape
    if K != g.K:
        raise ValueError(f"qdot: activations have {K} columns, the weights {g.K}")
    if out is None:
        out = torch.empty((M, g.rows), dtype=torch.float32)
    elif out.shape != (M, g.rows) or out.dtype is not torch.float32 or out.stride(1) != 1:
        raise ValueError("qdot: out must be float32 [T, rows] with unit column stride")
    st, keep = g._struct, g._struct.exact
    if exact is not None:
        st.exact = _exact(exact)
    try:
        if g._fn(g._ptr, x.data_ptr(), x.stride(0), M, out.data_ptr(), out.stride(0), n_threads or torch.get_num_threads()):
            raise RuntimeError("qdot: matmul failed")
    finally:
        st.exact = keep
    return out


def matmul(x: torch.Tensor | QActs, w: QdotWeight, n_threads: int | None = None,
           out: torch.Tensor | None = None, exact: int | None = None) -> torch.Tensor:
    """x float32 [T, cols] (or its `quantize_activations` of kind `w.act_kind`) times the weight:
    y float32 [T, rows]. `out` may be a float32 [T, rows] view with unit column stride (e.g. a
    column slice of a fused q/k/v output). A float x is quantized inside the same C call. `exact`
    as `QdotGroup`'s (default 1, llama.cpp's order)."""
    if not isinstance(x, QActs):
        g = w._group
        if g is None:
            g = w._group = QdotGroup([w])
        return matmul_group(x, g, out, n_threads, exact)
    if x.kind != w.act_kind:
        raise ValueError(f"qdot: a {w.act_kind} weight got {x.kind} activations")
    M, K = x.q.shape
    if K != w.cols:
        raise ValueError(f"qdot: activations have {K} columns, the weight {w.cols}")
    if out is None:
        out = torch.empty((M, w.rows), dtype=torch.float32)
    elif out.shape != (M, w.rows) or out.dtype != torch.float32 or out.stride(1) != 1:
        raise ValueError("qdot: out must be float32 [T, rows] with unit column stride")
    if M == 0:
        return out
    xs = x.sums.data_ptr() if x.kind == "q8_0" else None
    xs1 = x.s1.data_ptr() if x.kind == "q8_0" else None
    bsum = x.sums.data_ptr() if x.kind == "q8_K" else None
    rc = _lib().qd_matmul(w.qtype, w.data.data_ptr(), w.rows, w.cols, x.q.data_ptr(), x.d.data_ptr(), xs, xs1, bsum, M,
                          out.data_ptr(), out.stride(0), _threads(n_threads),
                          1 if exact is None else _exact(exact))
    if rc != 0:
        raise RuntimeError("qdot: matmul failed")
    return out


def dequantize_rows(w: QdotWeight, ids: torch.Tensor | None = None, n_threads: int | None = None) -> torch.Tensor:
    """Rows `ids` (default all) of the weight as float32 [n, cols], bit-identical to
    kernels.dequant_ref (embedding lookups from a repacked table)."""
    ids = torch.arange(w.rows, dtype=torch.int64) if ids is None else ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty((ids.numel(), w.cols), dtype=torch.float32)
    if ids.numel():
        _lib().qd_dequant_rows(w.qtype, w.data.data_ptr(), w.rows, w.cols, ids.data_ptr(), ids.numel(),
                               out.data_ptr(), _threads(n_threads))
    return out

"""The quantized KV cache, plain numpy / torch: the oracle of kernels/cpu/kv_quant.c and of the Triton
kernels that read and write it (kernels/triton/kv_quant.py).

A quantized cache is a uint8 tensor [NB, BS, KVH, row_bytes(type, D)]: each (cell, KV head) row the
head's D values as D / 32 GGML blocks of its type, as llama.cpp's KV cache holds them
(`-ctk` / `-ctv`: q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl). A float cache (f16, f32, bf16) stays a float
tensor [NB, BS, KVH, D]; `k_type` / `v_type` None means that.

`quantize_rows` is llama.cpp's write of a row (ggml_set_rows -> the CPU type traits' from_float):
Q8_0 the x86 AVX2 quantize_row_q8_0 (round half to even), the others ggml-quants.c's
quantize_row_*_ref, every float operation a single float32 operation (ggml-base has no FMA), so the
C kernel equals it bit for bit. `dequantize_rows` is ggml's dequantize_row_* (gguf-py's, the same
float32 operations). `paged_attention` / `write_kv` are the float references of the ops over such
caches: the caches dequantized, then kernels.ref's float32 attention (the query not quantized).
"""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf import quants as gq

from . import ref

KV_QUANT_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL)
# llama.cpp's names (common/arg.cpp kv_cache_types) -> GGML type
KV_CACHE_TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1,
                  "iq4_nl": Q.IQ4_NL, "q5_0": Q.Q5_0, "q5_1": Q.Q5_1}
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def is_quantized(t) -> bool:
    return t is not None and Q(t) in KV_QUANT_TYPES


def row_bytes(t, D: int) -> int:
    """Bytes of one (cell, head) row of D values of type t."""
    bs, ts = GGML_QUANT_SIZES[Q(t)]
    return D // bs * ts


def head_dim(t, rb: int) -> int:
    bs, ts = GGML_QUANT_SIZES[Q(t)]
    return rb // ts * bs


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape[:-1], 2 * x.shape[-1])


def _first_absmax(b: np.ndarray) -> np.ndarray:
    """The value of largest |x| in each block, the first such (ggml's strict `amax < |v|`) -> [n, 1]"""
    return np.take_along_axis(b, np.abs(b).argmax(axis=-1)[:, None], axis=-1)


def _nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & 15) | ((hi.astype(np.uint8) & 15) << 4)


def _qh(q: np.ndarray) -> np.ndarray:
    """bit j of the 5-bit codes' fifth bits, little-endian uint32 -> [n, 4] bytes"""
    return np.packbits(((q >> 4) & 1).astype(np.uint8), axis=-1, bitorder="little")


def _best_index(al: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8 over the IQ4_NL values, vectorized"""
    v = IQ4_NL_VALUES.astype(np.float32)
    ml = np.clip((al[..., None] >= v).sum(-1) - 1, 0, 14)  # the last value <= al (binary search's ml)
    lo, hi = v[ml], v[ml + 1]
    idx = np.where((al - lo).astype(np.float32) < (hi - al).astype(np.float32), ml, ml + 1)
    return np.where(al <= v[0], 0, np.where(al >= v[15], 15, idx))


def _quantize_blocks(b: np.ndarray, t: Q, nb: int) -> np.ndarray:
    """b: [n, 32] float32, rows of nb blocks -> [n, type_size] uint8"""
    f32 = np.float32
    n = b.shape[0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if t in (Q.Q8_0,):
            amax = np.abs(b).max(axis=-1, keepdims=True)
            d = amax / f32(127)
            idv = np.where(amax != 0, f32(127) / amax, f32(0)).astype(f32)
            q = np.rint(b * idv).astype(np.int8)
            return np.concatenate([_f16(d), q.view(np.uint8)], axis=-1)
        if t in (Q.Q4_0, Q.Q5_0):
            lim, off = (15, f32(8.5)) if t == Q.Q4_0 else (31, f32(16.5))
            d = _first_absmax(b) / f32(-(lim + 1) // 2)
            idv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            q = np.minimum(lim, np.trunc(b * idv + off).astype(np.int32))
            out = [_f16(d)] + ([_qh(q)] if t == Q.Q5_0 else []) + [_nibbles(q[:, :16], q[:, 16:])]
            return np.concatenate(out, axis=-1)
        if t in (Q.Q4_1, Q.Q5_1):
            lim = 15 if t == Q.Q4_1 else 31
            mn, mx = b.min(axis=-1, keepdims=True), b.max(axis=-1, keepdims=True)
            d = (mx - mn) / f32(lim)
            idv = np.where(d != 0, f32(1) / d, f32(0)).astype(f32)
            q = np.trunc((b - mn) * idv + f32(0.5)).astype(np.int32)
            q = np.minimum(lim, q) if t == Q.Q4_1 else q & 0xFF
            out = [_f16(d), _f16(mn)] + ([_qh(q)] if t == Q.Q5_1 else []) + [_nibbles(q[:, :16], q[:, 16:])]
            return np.concatenate(out, axis=-1)
        if t == Q.IQ4_NL:
            amax = np.abs(b).max(axis=-1, keepdims=True)
            d0 = (_first_absmax(b) / f32(-127)).astype(f32)
            idv = (f32(1) / d0).astype(f32)
            L = _best_index(b * idv)
            qv = IQ4_NL_VALUES[L].astype(f32)
            w = b * b
            sumqx = np.zeros((n, 1), f32)
            sumq2 = np.zeros((n, 1), f32)
            for j in range(32):  # ggml's sequential sums
                sumqx = sumqx + w[:, j:j + 1] * qv[:, j:j + 1] * b[:, j:j + 1]
                sumq2 = sumq2 + w[:, j:j + 1] * qv[:, j:j + 1] * qv[:, j:j + 1]
            d = np.where(sumq2 > 0, sumqx / sumq2, f32(0)).astype(f32)
            small = amax < f32(1e-15)
            d = np.where(small, f32(0), d)
            L = _carry_codes(L, small[:, 0], nb)
            return np.concatenate([_f16(d), _nibbles(L[:, :16], L[:, 16:])], axis=-1)
    raise ValueError(f"not a KV cache type: {t!r}")


def _carry_codes(L: np.ndarray, small: np.ndarray, nb: int) -> np.ndarray:
    """ggml keeps a row's code scratch across its blocks: a block under GROUP_MAX_EPS (d = 0) keeps
    the previous block's codes (zeros for a row's first block, where the C kernel's scratch starts)."""
    L = L.copy()
    for i in np.nonzero(small)[0]:
        L[i] = L[i - 1] if i % nb else 0
    return L


def quantize_rows(x: torch.Tensor, t) -> torch.Tensor:
    """x [..., D] (float) -> uint8 [..., row_bytes(t, D)]: llama.cpp's write of each row."""
    t = Q(t)
    D = x.shape[-1]
    a = x.detach().to(torch.float32).cpu().contiguous().numpy().reshape(-1, D)
    nb = D // 32
    out = _quantize_blocks(a.reshape(-1, 32), t, nb)
    return torch.from_numpy(out.reshape(*x.shape[:-1], row_bytes(t, D)).copy())


def dequantize_rows(data: torch.Tensor, t, D: int | None = None) -> torch.Tensor:
    """uint8 [..., row_bytes] -> float32 [..., D] (ggml's dequantize_row_*)."""
    t = Q(t)
    rb = data.shape[-1]
    D = D or head_dim(t, rb)
    a = data.detach().cpu().contiguous().numpy().reshape(-1, rb)
    out = gq.dequantize(a, t).astype(np.float32)
    return torch.from_numpy(out.reshape(*data.shape[:-1], D))


def cache_floats(cache: torch.Tensor, t) -> torch.Tensor:
    """A cache [NB, BS, KVH, row] of type t (None: a float cache) as float32 [NB, BS, KVH, D]."""
    return cache.float() if not is_quantized(t) else dequantize_rows(cache, t).to(cache.device)


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_type=None, v_type=None) -> None:
    """ref.write_kv where a cache may be quantized: its rows quantized as llama.cpp writes them."""
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    keep = slots >= 0
    slots, k, v = slots[keep], k[keep], v[keep]
    for x, cache, t in ((k, k_cache, k_type), (v, v_cache, v_type)):
        NB, BS, KVH, W = cache.shape
        rows = quantize_rows(x, t).to(cache.device) if is_quantized(t) else x.to(cache.dtype)
        cache.view(NB * BS, KVH, W).index_copy_(0, slots, rows)


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float, softcap: float = 0.0,
                    max_q_len: int | None = None, window: int = 0, k_type=None, v_type=None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """ref.paged_attention over the dequantized caches (float32; the query as given; `sinks`: gpt-oss's)."""
    return ref.paged_attention(q.float(), cache_floats(k_cache, k_type), cache_floats(v_cache, v_type), block_tables,
                               cu_seqlens_q, kv_lens, scale, softcap, max_q_len, window, sinks=sinks).to(q.dtype)


def rotation_sizes(type_k, type_v, head_dim: int) -> tuple[int, int]:
    """llama.cpp b1's Hadamard rotation of a quantized cache (llama_kv_cache attn_rot_k / attn_rot_v,
    unless LLAMA_ATTN_ROT_DISABLE): (n_k, n_v), 0 for none. K (and the query): the largest power of
    two from 64 dividing the head dimension; V (and the attention's output): 64; each where its
    cache is quantized and the head dimension a multiple of 64."""
    nk = 0
    if is_quantized(type_k) and head_dim % 64 == 0:
        nk = 64
        while head_dim % (2 * nk) == 0:
            nk *= 2
    nv = 64 if is_quantized(type_v) and head_dim % 64 == 0 else 0
    return nk, nv


def fwht(x: torch.Tensor, n: int) -> torch.Tensor:
    """Every n consecutive values of x (float32, last dim a multiple of n) times the normalized
    n x n Hadamard matrix, as ggml-cpu's fast Walsh-Hadamard transform computes it (the matmul
    llama.cpp hints GGML_HINT_SRC0_IS_HADAMARD): x * (1 / sqrtf(n)), then butterflies (u + v, u - v)
    over lengths 1, 2, 4, ...: every operation one float32 rounding, the same at any vector width.
    Its own inverse (up to rounding)."""
    shape = x.shape
    y = x.float().reshape(-1, n) * torch.tensor(1.0, dtype=torch.float32).div(torch.tensor(float(n)).sqrt())
    ln = 1
    while ln < n:
        y = y.reshape(-1, n // (2 * ln), 2, ln)
        u, v = y[:, :, 0], y[:, :, 1]
        y = torch.stack((u + v, u - v), dim=2).reshape(-1, n)
        ln *= 2
    return y.reshape(shape)

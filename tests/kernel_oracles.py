"""Test helpers (not part of the product): random GGUF weights, paged KV layouts and float64
oracles.

The oracles are written independently of `kernels.ref` (different formulation: complex numbers
for RoPE, per-sequence dense attention with explicit positions, gguf-py's numpy dequantizer) so
that they can check the reference ops, the CPU backend and the Triton kernels alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from kernels.qweight import QWeight

QUANT_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
FLOAT_QTYPES = [Q.F32, Q.F16, Q.BF16]

# Byte offsets of the float16 super-scales inside one block; every other byte is left random.
_F16_FIELDS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
    Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
}


def random_qweight(qtype: Q, rows: int, cols: int, gen: torch.Generator | None = None,
                   device: str | torch.device = "cpu") -> QWeight:
    """A weight with uniformly random quant bits and random finite scales (any GGUF type)."""
    kw = dict(generator=gen, device=device)
    if qtype in FLOAT_QTYPES:
        dt = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}[qtype]
        return QWeight(torch.randn(rows, cols, **kw).to(dt), qtype, rows, cols)
    bs, ts = GGML_QUANT_SIZES[qtype]
    assert cols % bs == 0, (qtype, cols)
    nblk = cols // bs
    data = torch.randint(0, 256, (rows, nblk, ts), dtype=torch.uint8, **kw)
    for off in _F16_FIELDS[qtype]:
        scale = (torch.rand(rows, nblk, **kw) * 0.02 + 0.005).to(torch.float16)
        sign = torch.where(torch.rand(rows, nblk, **kw) < 0.5, -1.0, 1.0).to(torch.float16)
        data[:, :, off : off + 2] = (scale * sign).contiguous().view(torch.uint8).view(rows, nblk, 2)
    return QWeight(data.reshape(rows, nblk * ts).contiguous(), qtype, rows, cols)


def dequant_oracle(w: QWeight) -> torch.Tensor:
    """float64 [rows, cols] via gguf-py's numpy dequantizer."""
    if w.is_float:
        return w.data.double().cpu()
    from gguf.quants import dequantize

    arr = dequantize(w.data.cpu().numpy(), w.qtype)
    return torch.from_numpy(np.ascontiguousarray(arr)).double().reshape(w.rows, w.cols)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (NaN anywhere in `got` gives NaN)."""
    got = got.detach().double().cpu()
    want = want.detach().double().cpu()
    assert got.shape == want.shape, (got.shape, want.shape)
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def rms_norm_oracle(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight.double()


def rope_neox_f64(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """NEOX RoPE of x [T, NH, D] at positions [T] with frequencies base^(-2i/D), all in float64
    (the whole-model float64 references of the architecture tests)."""
    D = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
    a, b = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def rope_oracle(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool) -> torch.Tensor:
    """Complex-number formulation in float64; the angle pos * inv_freq is rounded to float32 first
    (as llama.cpp and the kernels compute it), everything after it is float64."""
    x = x.double()
    R = inv_freq.shape[0]
    ang = (positions.float()[:, None, None] * inv_freq.float()[None, None, :]).double()
    rot = torch.polar(torch.ones_like(ang), ang)  # [T, 1, R]
    out = x.clone()
    if neox:
        z = torch.complex(x[..., :R], x[..., R : 2 * R]) * rot
        out[..., :R], out[..., R : 2 * R] = z.real, z.imag
    else:
        z = torch.view_as_complex(x[..., : 2 * R].reshape(*x.shape[:-1], R, 2).contiguous()) * rot
        out[..., : 2 * R] = torch.view_as_real(z).reshape(*x.shape[:-1], 2 * R)
    return out


@dataclass
class PagedCase:
    """A random paged-attention problem plus the dense per-sequence K/V it encodes."""

    q: torch.Tensor  # [T, H, D]
    k_cache: torch.Tensor  # [NB, BS, KVH, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, MAXB] int32
    cu_seqlens_q: torch.Tensor  # [S+1] int32
    kv_lens: torch.Tensor  # [S] int32
    dense_k: list  # per sequence [L, KVH, D] (cache dtype)
    dense_v: list


def make_paged_case(
    q_lens: list[int],
    kv_lens: list[int],
    H: int,
    KVH: int,
    D: int,
    BS: int,
    dtype: torch.dtype = torch.float16,
    gen: torch.Generator | None = None,
) -> PagedCase:
    """Blocks are handed out in a random permutation (tables are not ascending); unused
    cache blocks hold garbage (large values) that a correct kernel never reads."""
    S = len(q_lens)
    nblocks = [(L + BS - 1) // BS for L in kv_lens]
    NB = sum(nblocks) + 3
    perm = torch.randperm(NB, generator=gen)
    maxb = max(max(nblocks), 1) + 1
    bt = torch.full((S, maxb), NB + 1000, dtype=torch.int32)  # out of range past the end: must not be read
    k_cache = torch.full((NB, BS, KVH, D), 1e4).to(dtype)
    v_cache = torch.full((NB, BS, KVH, D), 1e4).to(dtype)
    dense_k, dense_v = [], []
    used = 0
    for s in range(S):
        L = kv_lens[s]
        blocks = perm[used : used + nblocks[s]]
        used += nblocks[s]
        bt[s, : nblocks[s]] = blocks.to(torch.int32)
        k = torch.randn(L, KVH, D, generator=gen).to(dtype)
        v = torch.randn(L, KVH, D, generator=gen).to(dtype)
        for i in range(L):
            k_cache[blocks[i // BS], i % BS] = k[i]
            v_cache[blocks[i // BS], i % BS] = v[i]
        dense_k.append(k)
        dense_v.append(v)
    T = sum(q_lens)
    q = torch.randn(T, H, D, generator=gen).to(dtype)
    cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32)
    return PagedCase(q, k_cache, v_cache, bt, cu, torch.tensor(kv_lens, dtype=torch.int32), dense_k, dense_v)


def attention_oracle(case: PagedCase, scale: float, softcap: float = 0.0, window: int = 0) -> torch.Tensor:
    """float64 [T, H, D]: per query head, dense causal attention with explicit positions; window > 0:
    a query at position p sees keys p - window + 1 .. p only (llama.cpp's standard SWA mask)."""
    T, H, D = case.q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    cu = case.cu_seqlens_q.tolist()
    for s, L in enumerate(case.kv_lens.tolist()):
        q0, q1 = cu[s], cu[s + 1]
        if q1 == q0:
            continue
        k = case.dense_k[s].double()
        v = case.dense_v[s].double()
        KVH = k.shape[1]
        for h in range(H):
            kh = h // (H // KVH)
            sc = case.q[q0:q1, h].double() @ k[:, kh].T * scale  # [ql, L]
            if softcap > 0:
                sc = softcap * torch.tanh(sc / softcap)
            pos = torch.arange(L - (q1 - q0), L)[:, None]
            kpos = torch.arange(L)[None, :]
            sc = sc.masked_fill(kpos > pos, float("-inf"))
            if window > 0:
                sc = sc.masked_fill(kpos <= pos - window, float("-inf"))
            out[q0:q1, h] = torch.softmax(sc, -1) @ v[:, kh]
    return out

"""Torch reference ops: the CPU engine's hot path and the oracle for the Triton kernels.

Every function here has the signature listed in docs/DESIGN.md ("Kernel dispatch surface").
They import only torch (and the GGUF dequantizer), never triton, so the CPU engine does not pay for
a triton import. Math is done in float32 and results are cast back to the input dtype.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

from . import cpu_attention, cpu_gemv, cpu_qgemv
from .qweight import QWeight

# Dequantize at most this many weight elements at once inside qmatmul (bounds temporary memory:
# a 128k x 4096 output head would otherwise need 2 GiB of float32).
_QMATMUL_CHUNK_ELEMS = 1 << 24
# Batched decode attention pads every sequence to the longest; only do it while the padded KV
# gather stays below this many elements.
_BATCHED_DECODE_MAX_ELEMS = 1 << 26
# Manual (softcap) attention: bound the [KVH, G, q_chunk, L] score tensor.
_SCORE_CHUNK_ELEMS = 1 << 25


def _dequantize_quant(w: QWeight, dtype: torch.dtype) -> torch.Tensor:
    try:
        from .dequant_ref import dequantize as _deq  # torch GGUF dequantizers
    except ImportError:  # pragma: no cover - until kernels/dequant_ref.py lands
        _deq = None
    if _deq is not None:
        return _deq(w, dtype)
    import numpy as np
    from gguf.quants import dequantize as gguf_dequantize

    arr = gguf_dequantize(w.data.cpu().numpy().astype(np.uint8, copy=False), w.qtype)
    return torch.from_numpy(np.ascontiguousarray(arr)).reshape(w.rows, w.cols).to(
        device=w.data.device, dtype=dtype
    )


# Weights at least this large (elements) use the batched-GEMV kernel for decode batches.
_BGEMV_MIN_ELEMS = 1 << 16
# Tiled weights smaller than this run the GEMV kernel on one thread.
_BGEMV_MT_MIN_ELEMS = 1 << 20
# Tiled weights up to this size are unpacked for prefill-sized products instead.
_UNPACK_MAX_ELEMS = 1 << 22
# From this many rows on (prefill) a matmul goes to torch's multi-threaded BLAS; below it, numpy's
# OpenBLAS (kept single-threaded by the engine) has less per-call overhead.
_BLAS_MT_MIN_M = 32


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """Once at load, float weights on the CPU get the layout their matmul reads fastest:
    matrices of at least 2^16 elements go into 64-row tiles for the batched-GEMV kernel (`kernels.cpu_gemv`,
    one pass over the weights per decode step whatever the batch), the others become float32
    [cols, rows] contiguous for BLAS (about 3x faster than [rows, cols] for small batches).
    Quantized weights are repacked, value for value, into the affine-integer tiles of
    `kernels.cpu_qgemv` when `pack_quantized` and its C kernel is available (vectorized); otherwise they stay in their
    block format (dequantized on every matmul) unless `unpack_quantized`: then they are
    dequantized once here and treated as float weights."""
    if w.layout != "rows" or w.data.device.type != "cpu":
        return w
    if not w.is_float and pack_quantized and cpu_qgemv.supports(w) and cpu_qgemv.available():
        return cpu_qgemv.pack(w)
    if not w.is_float:
        if not unpack_quantized:
            return w
        w = QWeight.from_float(dequantize(w, torch.float32))
    if w.rows * w.cols >= _BGEMV_MIN_ELEMS and cpu_gemv.available():
        # float16 / bfloat16 stay in their type (half the bytes per step; widened exactly in C)
        keep = w.data.dtype in (torch.float16, torch.bfloat16) and cpu_gemv.i8_fast()
        data = w.data if keep else w.data.float()
        qtype = w.qtype if keep else GGMLQuantizationType.F32
        return QWeight(cpu_gemv.pack(data), qtype, w.rows, w.cols, "tiles64")
    return QWeight(w.data.T.to(torch.float32).contiguous(), GGMLQuantizationType.F32, w.rows, w.cols, "cols")


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, cols] matrix of `w` in `dtype`."""
    if w.layout in cpu_qgemv.LAYOUTS:
        return cpu_qgemv.unpack(w).to(dtype)
    if w.is_float:
        if w.layout == "tiles64":
            return cpu_gemv.unpack(w.data, w.rows).to(dtype)
        return (w.data.T if w.layout == "cols" else w.data).to(dtype)
    return _dequantize_quant(w, dtype)


def _row_slice(w: QWeight, r0: int, r1: int) -> QWeight:
    return QWeight(w.data[r0:r1], w.qtype, r1 - r0, w.cols)


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[T, rows] = x[T, cols] @ W^T, output dtype = x.dtype."""
    if w.layout in cpu_qgemv.LAYOUTS:  # any T: the kernel beats BLAS on dequantized rows here
        nt = 1 if x.shape[0] <= cpu_gemv.MAX_M and w.rows * w.cols < _BGEMV_MT_MIN_ELEMS else None
        return cpu_qgemv.qgemv(x.float(), w, nt).to(x.dtype)
    if w.layout == "tiles64":  # one pass over the weights per 16 rows of x
        if x.shape[0] > cpu_gemv.MAX_M and w.rows * w.cols <= _UNPACK_MAX_ELEMS:
            # prefill through a small matrix: unpacking it (a ~1 MB copy) and one multi-threaded
            # BLAS call beats many passes of the GEMV kernel
            return x @ cpu_gemv.unpack(w.data, w.rows).T.to(x.dtype)
        xf = x.float()
        # small matrices on one thread: an OpenMP fork per layer matmul costs more than it saves,
        # and idle workers spinning on both cores starve the HTTP thread
        nt = 1 if w.rows * w.cols < _BGEMV_MT_MIN_ELEMS else None
        ys = [cpu_gemv.bgemv(xf[i:i + cpu_gemv.MAX_M], w.data, w.rows, nt) for i in range(0, x.shape[0], cpu_gemv.MAX_M)]
        return (ys[0] if len(ys) == 1 else torch.cat(ys)).to(x.dtype)
    if w.layout == "cols":
        if x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] < _BLAS_MT_MIN_M:
            # numpy's BLAS (OpenBLAS) beats torch's MKL sgemm on small-M, large-N products on
            # AMD cores by 2-3x; both run in float32 with the same accumulation order per row
            return torch.from_numpy(np.matmul(x.contiguous().numpy(), w.data.numpy()))
        return x @ w.data.to(x.dtype)
    if w.is_float:
        if x.device.type == "cpu" and x.dtype == torch.float32 and w.data.dtype == torch.float32:
            if x.shape[0] < _BLAS_MT_MIN_M:
                return torch.from_numpy(np.matmul(x.contiguous().numpy(), w.data.numpy().T))
        wt = w.data if w.data.dtype == x.dtype else w.data.to(x.dtype)
        return x @ wt.T
    chunk = max(1, _QMATMUL_CHUNK_ELEMS // max(1, w.cols))
    if chunk >= w.rows:
        return x @ dequantize(w, x.dtype).T
    y = torch.empty(x.shape[0], w.rows, dtype=x.dtype, device=x.device)
    for r0 in range(0, w.rows, chunk):
        r1 = min(w.rows, r0 + chunk)
        torch.matmul(x, dequantize(_row_slice(w, r0, r1), x.dtype).T, out=y[:, r0:r1])
    return y


def embedding(ids: torch.Tensor, w: QWeight) -> torch.Tensor:
    """[T, cols] float32 rows `ids` of `w` (only the gathered rows are dequantized)."""
    ids = ids.to(device=w.data.device, dtype=torch.long)
    if w.layout in cpu_qgemv.LAYOUTS:
        return cpu_qgemv.rows(w, ids)
    if w.layout == "tiles64":
        return cpu_gemv.rows(w.data, ids).float()
    if w.layout == "cols":
        return w.data[:, ids].T.float()
    if w.is_float:
        return w.data[ids].float()
    return dequantize(QWeight(w.data[ids], w.qtype, ids.numel(), w.cols), torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x[T, C] * rsqrt(mean(x^2) + eps) * weight[C], computed in float32, returned in x.dtype."""
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv * weight.float()).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual); the sum is returned in x.dtype."""
    s = x + residual
    return rms_norm(s, weight, eps), s


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotate x[T, NH, D] by angle positions[T] * inv_freq[R] (R <= D/2; dims past 2R pass through).

    neox=False: pairs (x[2i], x[2i+1]) (GGML "norm" mode, llama).
    neox=True:  pairs (x[i], x[i + R]) (GGML "neox" mode, qwen2/qwen3).
    Positions may be negative/deltas (re-rotating cached keys). Returns a new tensor.
    """
    R = inv_freq.shape[0]
    ang = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]  # [T, R]
    cos = torch.cos(ang)[:, None, :]  # [T, 1, R]
    sin = torch.sin(ang)[:, None, :]
    xf = x.float()
    out = xf.clone()
    if neox:
        x0, x1 = xf[..., :R], xf[..., R : 2 * R]
        out[..., :R] = x0 * cos - x1 * sin
        out[..., R : 2 * R] = x0 * sin + x1 * cos
    else:
        x0, x1 = xf[..., 0 : 2 * R : 2], xf[..., 1 : 2 * R : 2]
        out[..., 0 : 2 * R : 2] = x0 * cos - x1 * sin
        out[..., 1 : 2 * R : 2] = x0 * sin + x1 * cos
    return out.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate[T, F]) * up[T, F]."""
    if gate.dtype == torch.float32:
        return F.silu(gate) * up
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k_cache/v_cache[NB, BS, KVH, D]: store k/v[T, KVH, D] at slot = block * BS + offset.

    Negative slots are skipped (padding), as in the Triton kernel.
    """
    NB, BS, KVH, D = k_cache.shape
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    if bool((slots < 0).any()):
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    k_cache.view(NB * BS, KVH, D).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(NB * BS, KVH, D).index_copy_(0, slots, v.to(v_cache.dtype))


def _gather_kv(cache: torch.Tensor, blocks: torch.Tensor, L: int) -> torch.Tensor:
    """[L, KVH, D] float32 keys (or values) of one sequence."""
    NB, BS, KVH, D = cache.shape
    return cache[blocks].reshape(-1, KVH, D)[:L].float()


def _attend_manual(q, k, v, scale, softcap, q_pos0):
    """q[ql, H, D], k/v[L, KVH, D] float32 -> [ql, H, D] float32; causal with query offset q_pos0."""
    ql, H, D = q.shape
    L, KVH, _ = k.shape
    G = H // KVH
    qh = q.reshape(ql, KVH, G, D).permute(1, 2, 0, 3)  # [KVH, G, ql, D]
    kh = k.permute(1, 0, 2)[:, None]  # [KVH, 1, L, D]
    vh = v.permute(1, 0, 2)[:, None]
    out = torch.empty(KVH, G, ql, D, dtype=torch.float32, device=q.device)
    step = max(1, _SCORE_CHUNK_ELEMS // max(1, KVH * G * L))
    kpos = torch.arange(L, device=q.device)
    for c0 in range(0, ql, step):
        c1 = min(ql, c0 + step)
        s = (qh[:, :, c0:c1] @ kh.transpose(-1, -2)) * scale  # [KVH, G, c, L]
        if softcap > 0.0:
            s = softcap * torch.tanh(s / softcap)
        qpos = q_pos0 + torch.arange(c0, c1, device=q.device)
        s = s.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
        out[:, :, c0:c1] = torch.softmax(s, dim=-1) @ vh
    return out.permute(2, 0, 1, 3).reshape(ql, H, D)


def _attend_sdpa(q, k, v, scale, q_pos0):
    ql, H, D = q.shape
    L, KVH, _ = k.shape
    G = H // KVH
    qh = q.permute(1, 0, 2)[None]  # [1, H, ql, D]
    kh = k.permute(1, 0, 2)[None]  # [1, KVH, L, D]
    vh = v.permute(1, 0, 2)[None]
    causal, mask = False, None
    if ql == L and q_pos0 == 0:
        causal = ql > 1  # a whole sequence: the plain causal mask
    elif ql > 1:
        qpos = q_pos0 + torch.arange(ql, device=q.device)
        mask = torch.arange(L, device=q.device)[None, :] <= qpos[:, None]  # [ql, L]
    # (a single query sits at the last position and sees every key: no mask)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal, scale=scale,
                                       enable_gqa=G > 1)
    return o[0].permute(1, 0, 2)


def _decode_batched(q, k_cache, v_cache, block_tables, lens, scale, softcap):
    """All sequences have one query. q[S, H, D] -> [S, H, D] float32."""
    S, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    G = H // KVH
    maxL = max(lens)
    nb = (maxL + BS - 1) // BS
    bt = block_tables[:, :nb].long().clamp(0, NB - 1)  # entries past a sequence's end are masked
    k = k_cache[bt].reshape(S, nb * BS, KVH, D).float()  # [S, Lp, KVH, D]
    v = v_cache[bt].reshape(S, nb * BS, KVH, D).float()
    qh = q.float().reshape(S, KVH, G, D)
    s = torch.einsum("skgd,slkd->skgl", qh, k) * scale  # [S, KVH, G, Lp]
    if softcap > 0.0:
        s = softcap * torch.tanh(s / softcap)
    lens_t = torch.tensor(lens, device=q.device)
    valid = torch.arange(nb * BS, device=q.device)[None, :] < lens_t[:, None]  # [S, Lp]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("skgl,slkd->skgd", p, v)
    return o.reshape(S, H, D)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    softcap: float = 0.0,
    max_q_len: int | None = None,
) -> torch.Tensor:
    """q[T, H, D] over paged k/v_cache[NB, BS, KVH, D] -> [T, H, D] (see docs/DESIGN.md).
    `max_q_len` (the longest query run, when the caller knows it) lets device kernels skip a host
    sync; this reference reads the lengths on the host anyway.

    Sequence s owns query rows cu[s]:cu[s+1]; query j sits at position kv_lens[s] - q_len + j and
    attends causally to keys 0..pos. Softmax in float32; optional tanh soft-capping of the scores.
    """
    T, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    cu = cu_seqlens_q.tolist()
    lens = kv_lens.tolist()
    S = len(lens)
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if S == 0:
        return out
    qlens = [cu[s + 1] - cu[s] for s in range(S)]
    decode_only = all(n == 1 for n in qlens) and cu[0] == 0 and min(lens) > 0
    if decode_only and cpu_attention.supported(q, k_cache):  # C kernel, reads the blocks in place
        out[:S] = cpu_attention.paged_decode(q[:S], k_cache, v_cache, block_tables, lens, scale, softcap).to(q.dtype)
        return out
    if S > 1 and decode_only:
        nb = (max(lens) + BS - 1) // BS
        if S * nb * BS * KVH * D <= _BATCHED_DECODE_MAX_ELEMS and min(lens) > 0:
            o = _decode_batched(q[:S], k_cache, v_cache, block_tables, lens, scale, softcap)
            out[:S] = o.to(q.dtype)
            return out
    for s in range(S):
        q0, q1, L = cu[s], cu[s + 1], lens[s]
        if q1 == q0:
            continue
        blocks = block_tables[s, : (L + BS - 1) // BS].long()
        k = _gather_kv(k_cache, blocks, L)
        v = _gather_kv(v_cache, blocks, L)
        qs = q[q0:q1].float()
        if softcap > 0.0:
            o = _attend_manual(qs, k, v, scale, softcap, L - (q1 - q0))
        else:
            o = _attend_sdpa(qs, k, v, scale, L - (q1 - q0))
        out[q0:q1] = o.to(q.dtype)
    return out

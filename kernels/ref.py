"""Torch reference ops: the oracle every backend is tested against (docs/DESIGN.md, "Kernel
dispatch surface"), and the `"torch"` backend of `kernels.Backend`.

Plain torch plus the torch GGUF dequantizers of `kernels.dequant_ref`, written to be obviously
right rather than fast: no C kernels, no speed thresholds, no weight layout but the GGUF one
("rows"; the other layouts belong to the CPU backend, `kernels.cpu`). The only size bounds are on
temporary memory. Math is done in float32 and results are cast back to the input dtype. Imports
neither triton nor the C kernels. The CPU backend reuses the ops that are also its fastest choice
(norms, RoPE, SiLU, KV writes); each Triton kernel names its reference at the top of its file.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np
import torch
import torch.nn.functional as F

from . import dequant_ref
from .qweight import Experts, QWeight
from .ref_linear import gated_delta_net, gdn_gates, sigmoid, ssm_conv  # noqa: F401  (the gated linear-attention ops)

# Dequantize at most this many weight elements at once inside qmatmul (bounds temporary memory:
# a 128k x 4096 output head would otherwise need 2 GiB of float32).
_QMATMUL_CHUNK_ELEMS = 1 << 24
# Manual (softcap) attention: bound the [KVH, G, q_chunk, L] score tensor.
_SCORE_CHUNK_ELEMS = 1 << 25


def _gguf_layout(w: QWeight) -> None:
    if w.layout != "rows":
        raise ValueError(f"the reference ops read GGUF rows; layout {w.layout!r} is the CPU backend's (kernels.cpu)")


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """The reference reads the GGUF layout as it is; with `unpack_quantized`, quantized weights are
    dequantized once here (float32 rows) instead of on every matmul. Nothing is packed."""
    if w.is_float or not unpack_quantized:
        return w
    return QWeight.from_float(dequantize(w, torch.float32))


def cat_rows(ws: list[QWeight]) -> list[QWeight]:
    """Weights reading the same input, concatenated along the output dimension when they share a
    type and layout (one matmul reads them all); otherwise kept apart."""
    if len(ws) < 2 or len({w.qtype for w in ws}) != 1 or len({w.cols for w in ws}) != 1 \
            or any(w.layout != "rows" for w in ws):
        return list(ws)
    return [QWeight(torch.cat([w.data for w in ws], 0), ws[0].qtype, sum(w.rows for w in ws), ws[0].cols)]


def prepare_weights(ws: list[QWeight], unpack_quantized: bool = False, pack_quantized: bool = True) -> list[QWeight]:
    """Once at load, weights that read the same input (q/k/v, gate/up): `cat_rows`, then
    `prepare_weight` each. Concatenating the `qmatmul` outputs of the result along dim 1 gives
    x @ [W_0; W_1; ...]^T."""
    return [prepare_weight(w, unpack_quantized, pack_quantized) for w in cat_rows(ws)]


def packs_quantized() -> bool:
    """Whether `prepare_weight` repacks quantized weights for a kernel of this backend: no."""
    return False


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[rows, cols] matrix of `w` in `dtype`."""
    _gguf_layout(w)
    if w.is_float:
        return w.data.to(dtype)
    return dequant_ref.dequantize(w, dtype)


def _row_slice(w: QWeight, r0: int, r1: int) -> QWeight:
    return QWeight(w.data[r0:r1], w.qtype, r1 - r0, w.cols)


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[T, rows] = x[T, cols] @ W^T, output dtype = x.dtype."""
    _gguf_layout(w)
    if w.is_float:
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
    _gguf_layout(w)
    ids = ids.to(device=w.data.device, dtype=torch.long)
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


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """(x[T, C] - mean) * rsqrt(var + eps) * weight[C] + bias[C] (either may be None), as ggml_norm
    computes it: the mean and the variance summed in float64, the rest in float32; in x.dtype."""
    xf = x.float()
    mean = xf.double().mean(dim=-1, keepdim=True).float()
    d = xf - mean
    var = d.double().pow(2).mean(dim=-1, keepdim=True).float()
    y = d * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, theta_scale: float = 0.0) -> torch.Tensor:
    """[T, R] float32 angles: positions[T] * inv_freq[R]; with theta_scale > 0 as ggml's CPU rope
    chains them (ggml_rope_cache_init): t = position, t *= theta_scale per pair, rounded each step,
    angle = inv_freq[0] * t (freq_scale; 1 when unscaled)."""
    pos = positions.to(torch.float32)
    if theta_scale <= 0.0:
        return pos[:, None] * inv_freq.to(torch.float32)[None, :]
    R = inv_freq.shape[0]
    ts = torch.tensor(theta_scale, dtype=torch.float32, device=pos.device)
    ang = torch.empty((pos.shape[0], R), dtype=torch.float32, device=pos.device)
    t = pos.clone()
    f0 = inv_freq[0].to(torch.float32)
    for i in range(R):
        ang[:, i] = f0 * t
        t = t * ts
    return ang


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool,
         theta_scale: float = 0.0, mscale: float = 1.0) -> torch.Tensor:
    """Rotate x[T, NH, D] by the angles of `rope_angles` (R <= D/2; dims past 2R pass through), cos and
    sin multiplied by `mscale` in float32 first (ggml's rope_yarn: YaRN's magnitude factor, 1 otherwise).

    neox=False: pairs (x[2i], x[2i+1]) (GGML "norm" mode, llama).
    neox=True:  pairs (x[i], x[i + R]) (GGML "neox" mode, qwen2/qwen3).
    Positions may be negative/deltas (re-rotating cached keys). Returns a new tensor.
    """
    R = inv_freq.shape[0]
    ang = rope_angles(positions, inv_freq, theta_scale)  # [T, R]
    cos = torch.cos(ang)[:, None, :]  # [T, 1, R]
    sin = torch.sin(ang)[:, None, :]
    if mscale != 1.0:
        m = torch.tensor(mscale, dtype=torch.float32, device=cos.device)
        cos, sin = cos * m, sin * m
    xf = x.float()
    out = xf.clone()
    x0, x1 = (xf[..., :R], xf[..., R:2 * R]) if neox else (xf[..., 0:2 * R:2], xf[..., 1:2 * R:2])
    # as llama.cpp's build contracts ggml's rotate_pairs: fma(x0, cos, -(x1 sin)), fma(x0, sin, x1 cos)
    # (the fma through float64: x0 cos is exact there; one more rounding on the rare midpoint)
    r0 = (x0.double() * cos.double() - (x1 * sin).double()).float()
    r1 = (x0.double() * sin.double() + (x1 * cos).double()).float()
    if neox:
        out[..., :R], out[..., R:2 * R] = r0, r1
    else:
        out[..., 0:2 * R:2], out[..., 1:2 * R:2] = r0, r1
    return out.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate[T, F]) * up[T, F]."""
    if gate.dtype == torch.float32:
        return F.silu(gate) * up
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


@functools.lru_cache(maxsize=None)
def _gelu_f16_table(device: str) -> torch.Tensor:
    """ggml's `ggml_table_gelu_f16` as float32 [65536], indexed by the float16 bits of the input:
    f16(0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)))) for each float16 x, in
    float32 with glibc's tanhf, and `1.0f + GELU_COEF_A*x*x` as one fused multiply-add, as GCC
    contracts it in ggml-cpu.c (the fma emulated in float64, exact here: the float32 product is
    exact in float64 and |1 + ...| keeps the sum's rounding single). torch's own tanh GELU differs
    on 26 of the 37,376 finite inputs below 10 in magnitude (e.g. x = -1.999: -0.045471 vs
    -0.045502), enough to move Gemma's greedy tokens."""
    tanhf = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6").tanhf
    tanhf.restype, tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    a, k = np.float32(0.044715), np.float32(0.79788456080286535587989211986876)
    with np.errstate(all="ignore"):
        inner = ((a * x).astype(np.float64) * x.astype(np.float64) + 1.0).astype(np.float32)  # fma(A*x, x, 1)
        arg = (k * x) * inner
        th = np.array([tanhf(float(v)) if np.isfinite(v) else 0.0 for v in arg], dtype=np.float32)
        y = (np.float32(0.5) * x) * (np.float32(1.0) + th)
    return torch.from_numpy(y.astype(np.float16).astype(np.float32)).to(device)


def gelu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gelu(gate[T, F]) * up[T, F] with the tanh GELU as ggml's CPU GeGLU computes it: the gate
    rounded to float16 and looked up in ggml's table (`_gelu_f16_table`), 0 below -10 and the
    identity above 10; the product in float32. Device-agnostic torch."""
    g = gate.float()
    idx = g.half().view(torch.int16).long() & 0xFFFF
    t = _gelu_f16_table(str(g.device))[idx]
    t = torch.where(g <= -10.0, torch.zeros_like(g), torch.where(g >= 10.0, g, t))
    return (t * up.float()).to(gate.dtype)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_type=None,
    v_type=None,
) -> None:
    """k_cache/v_cache[NB, BS, KVH, D]: store k/v[T, KVH, D] at slot = block * BS + offset.

    Negative slots are skipped (padding), as in the Triton kernel. k_type / v_type: a quantized
    cache's GGML type (kernels/kv_quant_ref.py; None: a float cache).
    """
    if k_type is not None or v_type is not None:
        from . import kv_quant_ref
        return kv_quant_ref.write_kv(k, v, k_cache, v_cache, slot_mapping, k_type, v_type)
    NB, BS, KVH, D = k_cache.shape
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    if bool((slots < 0).any()):
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    k_cache.view(NB * BS, KVH, D).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(NB * BS, KVH, D).index_copy_(0, slots, v.to(v_cache.dtype))


def rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  inv_freq: torch.Tensor, neox: bool, theta_scale: float, mscale: float, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slot_mapping: torch.Tensor, k_type=None, v_type=None) -> torch.Tensor:
    """`rope` of q [T, H, D] and k [T, KVH, D], the rotated k and v written by `write_kv`; returns
    the rotated q (one launch on CUDA: kernels/triton/rope_write_kv.py)."""
    extra = () if mscale == 1.0 else (mscale,)  # (YaRN's magnitude factor: `rope`'s last argument)
    write_kv(rope(k, positions, inv_freq, neox, theta_scale, *extra), v, k_cache, v_cache, slot_mapping, k_type, v_type)
    return rope(q, positions, inv_freq, neox, theta_scale, *extra)


def _gather_kv(cache: torch.Tensor, blocks: torch.Tensor, L: int) -> torch.Tensor:
    """[L, KVH, D] float32 keys (or values) of one sequence."""
    NB, BS, KVH, D = cache.shape
    return cache[blocks].reshape(-1, KVH, D)[:L].float()


def _attend_manual(q, k, v, scale, softcap, q_pos0, window=0, sinks=None):
    """q[ql, H, D], k/v[L, KVH, D] float32 -> [ql, H, D] float32; causal with query offset q_pos0
    (keys at positions 0..L-1); window > 0: a query at p sees keys at positions > p - window;
    sinks [H]: one more logit per head in each softmax, with no value (gpt-oss)."""
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
        hidden = kpos[None, :] > qpos[:, None]
        if window > 0:
            hidden |= kpos[None, :] <= qpos[:, None] - window
        s = s.masked_fill(hidden, float("-inf"))
        if sinks is not None:
            sk = sinks.float().reshape(KVH, G, 1, 1).expand(KVH, G, c1 - c0, 1)
            out[:, :, c0:c1] = torch.softmax(torch.cat([s, sk], dim=-1), dim=-1)[..., :L] @ vh
            continue
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
    window: int = 0,
    k_type=None,
    v_type=None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q[T, H, D] over paged k/v_cache[NB, BS, KVH, D] -> [T, H, D] (see docs/DESIGN.md).
    `max_q_len` (the longest query run, when the caller knows it) lets device kernels skip a host
    sync; this reference reads the lengths on the host anyway.

    Sequence s owns query rows cu[s]:cu[s+1]; query j sits at position kv_lens[s] - q_len + j and
    attends causally to keys 0..pos. Softmax in float32; optional tanh soft-capping of the scores.
    window > 0 (sliding-window layers, llama.cpp's LLAMA_SWA_TYPE_STANDARD): a query at position p
    sees only keys at positions p - window + 1 .. p. k_type / v_type: a quantized cache's GGML
    type (kernels/kv_quant_ref.py: the caches dequantized first; None: a float cache). sinks [H]
    float32 (gpt-oss's attention sinks, ggml_soft_max_ext / flash_attn_ext with sinks): per head one
    more logit in every softmax whose value is zero, i.e. out = softmax-weighted V x S / (S + exp(sink - M)).
    """
    if k_type is not None or v_type is not None:
        from . import kv_quant_ref
        return kv_quant_ref.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap,
                                            max_q_len, window, k_type, v_type, sinks)
    T, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    cu = cu_seqlens_q.tolist()
    lens = kv_lens.tolist()
    S = len(lens)
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if S == 0:
        return out
    for s in range(S):
        q0, q1, L = cu[s], cu[s + 1], lens[s]
        if q1 == q0:
            continue
        qs = q[q0:q1].float()
        if window > 0:  # keys before the first query's window are never read
            k0 = max(0, L - (q1 - q0) - window + 1) // BS * BS
            blocks = block_tables[s, k0 // BS: (L + BS - 1) // BS].long()
            k = _gather_kv(k_cache, blocks, L - k0)
            v = _gather_kv(v_cache, blocks, L - k0)
            o = _attend_manual(qs, k, v, scale, softcap, L - k0 - (q1 - q0), window, sinks)
            out[q0:q1] = o.to(q.dtype)
            continue
        blocks = block_tables[s, : (L + BS - 1) // BS].long()
        k = _gather_kv(k_cache, blocks, L)
        v = _gather_kv(v_cache, blocks, L)
        if softcap > 0.0 or sinks is not None:
            o = _attend_manual(qs, k, v, scale, softcap, L - (q1 - q0), 0, sinks)
        else:
            o = _attend_sdpa(qs, k, v, scale, L - (q1 - q0))
        out[q0:q1] = o.to(q.dtype)
    return out


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                    mask: torch.Tensor | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Dense attention q[T, H, D] over k/v[S, KVH, D] -> [T, H, D] in q.dtype: softmax(scale q.k
    (tanh soft-capped when softcap > 0), keys where mask[T, S] (bool) is False hidden) @ v, every
    key visible without a mask; GQA: query head h reads KV head h // (H // KVH). Float32 math from
    the inputs as they are (the vision encoder and the image spans of a prompt)."""
    T, H, D = q.shape
    S, KVH, _ = k.shape
    G = H // KVH
    qh = q.float().reshape(T, KVH, G, D).permute(1, 2, 0, 3)  # [KVH, G, T, D]
    kh = k.float().permute(1, 0, 2)[:, None]  # [KVH, 1, S, D]
    vh = v.float().permute(1, 0, 2)[:, None]
    out = torch.empty(KVH, G, T, D, dtype=torch.float32, device=q.device)
    step = max(1, _SCORE_CHUNK_ELEMS // max(1, KVH * G * S))
    for c0 in range(0, T, step):
        c1 = min(T, c0 + step)
        s = (qh[:, :, c0:c1] @ kh.transpose(-1, -2)) * scale  # [KVH, G, c, S]
        if softcap > 0.0:
            s = softcap * torch.tanh(s / softcap)
        if mask is not None:
            s = s.masked_fill(~mask[c0:c1].to(device=q.device, dtype=torch.bool), float("-inf"))
        out[:, :, c0:c1] = torch.softmax(s, dim=-1) @ vh
    return out.permute(2, 0, 1, 3).reshape(T, H, D).to(q.dtype)


def topk(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest entries of a row [V], values descending: torch.topk."""
    return torch.topk(row, k)


def prepare_topk_head(w: QWeight) -> None:
    """The state `topk_logits` reads for the output head `w`, made once at load; None where the
    backend has no shortcut (callers then compute the full logits with `qmatmul`)."""
    return None


def topk_logits(x: torch.Tensor, w: QWeight, head, topk: list[int], banned: list[tuple[int, ...]]) -> torch.Tensor:
    """Logits [n, rows] float32 of x [n, cols] for rows of which only the `topk[i]` largest must be
    exact (0: the whole row), `banned[i]` tokens never among them: an implementation may return
    -inf for every entry that cannot be in that top-k. The reference computes every row exactly."""
    return qmatmul(x, w).float()


# ---------------------------------------------------------------------------------------------
# mixture of experts


def router_matmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """`kernels.router_matmul`: qmatmul in float32."""
    return qmatmul(x.float(), w).float()


def moe_route(logits: torch.Tensor, k: int, norm: bool = True, scale: float = 0.0, softmax_after: bool = False,
              softmax=None):
    """Router logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64), llama.cpp's
    build_moe_ffn with softmax gating: softmax over all experts in float32, the k largest
    probabilities (descending), divided by their sum (clamped below at 6.103515625e-5) when `norm`,
    times `scale` unless it is 0 or 1. `softmax_after` (gpt-oss, LLAMA_EXPERT_GATING_FUNC_TYPE_
    SOFTMAX_WEIGHT): the k largest logits, then the softmax over those k only (`softmax`: the
    backend's, default torch's). Plain torch on any device (no host sync)."""
    if softmax_after:
        top, ids = torch.topk(logits.float(), k, dim=-1)
        weights = (softmax or (lambda t: torch.softmax(t, dim=-1)))(top)
    else:
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, k, dim=-1)
    if norm:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
    if scale not in (0.0, 1.0):
        weights = weights * scale
    return weights, ids


def prepare_experts(gate: QWeight, up: QWeight, down: QWeight, n_expert: int, unpack_quantized: bool = False,
                    pack_quantized: bool = True) -> Experts:
    """Once at load: the stacked expert weights in the GGUF layout (`prepare_weight` each)."""
    n_ff, n_embd = gate.rows // n_expert, gate.cols
    return Experts(n_expert, n_ff, n_embd, *(prepare_weight(w, unpack_quantized, pack_quantized)
                                            for w in (gate, up, down)))


def moe_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, expert_fn) -> torch.Tensor:
    """sum_j weights[t, j] * expert_fn(ids[t, j], x[rows routed to it])[t] -> [T, C] in x.dtype: the
    tokens grouped by expert, `expert_fn(e, x_e [n_e, C]) -> [n_e, C]` called once per used expert
    (its weights read once for all its tokens), float32 accumulation. Reads the ids on the host."""
    T, C = x.shape
    out = torch.zeros(T, C, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        y = expert_fn(e, x[tok])
        out.index_add_(0, tok, y.float() * weights[tok, slot].float()[:, None])
    return out.to(x.dtype)


SWIGLU_OAI_ALPHA = 1.702  # llama.cpp's build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE
SWIGLU_OAI_LIMIT = 7.0


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_OAI_ALPHA,
               limit: float = SWIGLU_OAI_LIMIT) -> torch.Tensor:
    """ggml_swiglu_oai [.., F] float32: x = min(gate, limit), y = clamp(up, -limit, limit),
    x / (1 + exp(-alpha x)) * (y + 1) (gpt-oss's experts)."""
    x = gate.float().clamp(max=limit)
    y = up.float().clamp(-limit, limit)
    return x / (1.0 + torch.exp(alpha * -x)) * (y + 1.0)


def moe_slots(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, expert_fn) -> torch.Tensor:
    """As `moe_grouped` (each used expert called once for all its tokens), but summed as llama.cpp's
    build_moe_ffn does: each (token, slot)'s expert output times its weight, then the slots added
    in slot order (((y_0 + y_1) + y_2) + ...). -> [T, C] in x.dtype."""
    T, C = x.shape
    k = ids.shape[1]
    ys = torch.zeros(T, k, C, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        ys[tok, slot] = expert_fn(e, x[tok]).float() * weights[tok, slot].float()[:, None]
    out = ys[:, 0]
    for j in range(1, k):
        out = out + ys[:, j]
    return out.to(x.dtype)


def moe_biased(x: torch.Tensor, experts: Experts, weights: torch.Tensor, ids: torch.Tensor, matmul,
               act) -> torch.Tensor:
    """gpt-oss's experts (`experts.bias`, `experts.act`) with a backend's `matmul(x, w)` and gated
    activation `act(gate, up)`: per expert gate = W_g x + b_g, up = W_u x + b_u, out = W_d act(gate,
    up) + b_d (llama.cpp's mul_mat_id then add_id), mixed by `moe_slots`."""
    F, C = experts.n_ff, experts.n_embd
    gb, ub, db = experts.bias

    def expert(e: int, xe: torch.Tensor) -> torch.Tensor:
        xf = xe.float()
        if experts.split is not None:
            gu_w, down = experts.split[e]
            gu = torch.cat([matmul(xf, w) for w in gu_w], dim=1) if len(gu_w) > 1 else matmul(xf, gu_w[0])
            g, u = gu[:, :F], gu[:, F:]
        else:
            down = Experts.rows_of(experts.down, e, C)
            g = matmul(xf, Experts.rows_of(experts.gate, e, F))
            u = matmul(xf, Experts.rows_of(experts.up, e, F))
        a = act(g.float() + gb[e], u.float() + ub[e])
        return matmul(a, down).float() + db[e]

    return moe_slots(x, weights, ids, expert)


def moe_ffn(x: torch.Tensor, experts: Experts, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The experts' SwiGLU FFNs of x [T, C] mixed by the router: sum over j of weights[t, j] *
    down_e(silu(gate_e x_t) * up_e x_t) with e = ids[t, j] ([T, k] each) -> [T, C] in x.dtype
    (with `experts.bias`: gpt-oss's biased experts and activation, `moe_biased`)."""
    F, C = experts.n_ff, experts.n_embd
    if experts.bias is not None:
        return moe_biased(x, experts, weights, ids, qmatmul, swiglu_oai if experts.act == "swiglu_oai" else silu_mul)

    def expert(e: int, xe: torch.Tensor) -> torch.Tensor:
        xf = xe.float()
        a = silu_mul(qmatmul(xf, Experts.rows_of(experts.gate, e, F)), qmatmul(xf, Experts.rows_of(experts.up, e, F)))
        return qmatmul(a, Experts.rows_of(experts.down, e, C))

    return moe_grouped(x, weights, ids, expert)


def fused_decoder(layers, shape) -> None:
    """No fused decode loop here: the runtime runs its per-op path (`kernels.fused_decoder`)."""
    return None

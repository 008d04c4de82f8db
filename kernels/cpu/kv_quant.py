"""The quantized KV cache on the CPU (kernels/cpu/kv_quant.c; reference `kernels.kv_quant_ref`).

`write_kv` quantizes the new K / V rows into their cache as llama.cpp writes them; `paged_attention`
reads the caches in place as llama.cpp's row-by-row flash attention does once either is quantized
(ggml_compute_forward_flash_attn_ext_f16_one_chunk for every batch size: the query converted to K's
vec_dot_type, K . Q by the type's vec_dot in its AVX2 order, V dequantized into a float32
accumulator, or fattn.c's float16 one for an f16 V; gpt-oss's sinks after the last key). A prompt row is the decode of its position
(attention.paged_rows' convention), so a token's attention is the same bits in one batch, in chunks
or after a cached prefix. Without the compiled kernels (or for shapes they do not take), the
reference (dequantized caches, float32 attention).
"""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as Q

from .. import kv_quant_ref
from . import native

# the GGML type id of a float cache's dtype (kv_quant.c: 0 f32, 1 f16)
_FLOAT_IDS = {torch.float32: 0, torch.float16: 1}
# prompt rows per C call: its output and table copies stay small
_ROWS_PER_CALL = 4096


def _type_id(cache: torch.Tensor, t) -> int | None:
    if kv_quant_ref.is_quantized(t):
        return int(Q(t))
    return _FLOAT_IDS.get(cache.dtype)


def quantize_rows(x: torch.Tensor, t) -> torch.Tensor:
    """x [..., D] float -> uint8 [..., row_bytes]: llama.cpp's write (the C kernel, else the reference)."""
    lib = native.lib()
    D = x.shape[-1]
    if lib is None or D % 32:
        return kv_quant_ref.quantize_rows(x, t)
    xf = x.detach().to(torch.float32).contiguous()
    out = torch.empty((*x.shape[:-1], kv_quant_ref.row_bytes(t, D)), dtype=torch.uint8)
    if lib.kvq_quantize(xf.data_ptr(), out.data_ptr(), xf.numel() // D, D, int(Q(t))):
        return kv_quant_ref.quantize_rows(x, t)
    return out


def dequantize_rows(data: torch.Tensor, t) -> torch.Tensor:
    lib = native.lib()
    D = kv_quant_ref.head_dim(t, data.shape[-1])
    if lib is None:
        return kv_quant_ref.dequantize_rows(data, t)
    d = data.contiguous()
    out = torch.empty((*data.shape[:-1], D), dtype=torch.float32)
    if lib.kvq_dequantize(d.data_ptr(), out.data_ptr(), d.numel() // data.shape[-1], D, int(Q(t))):
        return kv_quant_ref.dequantize_rows(data, t)
    return out


def vec_dot(k_rows: torch.Tensor, q: torch.Tensor, t) -> torch.Tensor:
    """The type's vec_dot of each K row (uint8 [n, row_bytes]) with q [D] quantized to its vec_dot_type
    -> float32 [n] (the score before scaling; tests)."""
    lib = native.lib()
    n, D = k_rows.shape[0], q.shape[-1]
    out = torch.empty(n, dtype=torch.float32)
    kr, qf = k_rows.contiguous(), q.to(torch.float32).contiguous()
    if lib is None or lib.kvq_vec_dot(kr.data_ptr(), qf.data_ptr(), out.data_ptr(), n, D, int(Q(t))):
        raise RuntimeError("kv_quant.c unavailable for this shape")
    return out


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_type=None, v_type=None) -> None:
    """The contract of `kv_quant_ref.write_kv`: a quantized cache's rows quantized in C."""
    lib = native.lib()
    if lib is None or k_cache.device.type != "cpu" or k.shape[-1] % 32:
        return kv_quant_ref.write_kv(k, v, k_cache, v_cache, slot_mapping, k_type, v_type)
    slots = slot_mapping.to(torch.int64).contiguous()
    T, KVH, D = k.shape
    n_cells = k_cache.shape[0] * k_cache.shape[1]
    if T and (int(slots.max()) >= n_cells):
        raise IndexError(f"write_kv: slot {int(slots.max())} is outside the cache ({n_cells} slots)")
    for x, cache, t in ((k, k_cache, k_type), (v, v_cache, v_type)):
        if kv_quant_ref.is_quantized(t):
            assert cache.is_contiguous() and cache.dtype == torch.uint8
            xf = x.to(torch.float32).contiguous()
            lib.kvq_write(xf.data_ptr(), cache.data_ptr(), slots.data_ptr(), T, KVH, D, int(Q(t)))
        else:
            keep = slots >= 0
            NB, BS = cache.shape[:2]
            cache.view(NB * BS, KVH, D).index_copy_(0, slots[keep], x[keep].to(cache.dtype))


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float, softcap: float = 0.0,
                    max_q_len: int | None = None, window: int = 0, k_type=None, v_type=None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The contract of `kv_quant_ref.paged_attention`, in llama.cpp's float order (module docstring);
    `sinks` [H]: gpt-oss's attention sinks, applied after the last key as ggml's one chunk does."""
    lib = native.lib()
    kt, vt = _type_id(k_cache, k_type), _type_id(v_cache, v_type)
    T, H, D = q.shape
    cu, lens = cu_seqlens_q.tolist(), kv_lens.tolist()
    S = len(lens)
    if (lib is None or kt is None or vt is None or q.device.type != "cpu" or S == 0
            or not (k_cache.is_contiguous() and v_cache.is_contiguous())
            or any(not 0 <= cu[s + 1] - cu[s] <= lens[s] for s in range(S))):
        return kv_quant_ref.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap,
                                            max_q_len, window, k_type, v_type, sinks)
    NB, BS, KVH = k_cache.shape[:3]
    sk = sinks.to(torch.float32).contiguous() if sinks is not None else None
    q_lens = torch.tensor([cu[s + 1] - cu[s] for s in range(S)], dtype=torch.int64)
    seq = torch.repeat_interleave(torch.arange(S), q_lens)  # [n] the sequence of each row
    j = torch.arange(len(seq)) - (torch.tensor(cu[:S], dtype=torch.int64) - cu[0])[seq]
    row_lens = (torch.tensor(lens, dtype=torch.int64)[seq] - q_lens[seq] + j + 1).to(torch.int32)
    bt = block_tables.to(torch.int32)
    qf = q.float().contiguous()
    out = torch.zeros((T, H, D), dtype=torch.float32)
    n = len(seq)
    for i in range(0, n, _ROWS_PER_CALL):
        r0, r1 = cu[0] + i, cu[0] + min(i + _ROWS_PER_CALL, n)
        tab = bt[seq[i:i + _ROWS_PER_CALL]].contiguous()
        rl = row_lens[i:i + _ROWS_PER_CALL].contiguous()
        o = out[r0:r1]
        if lib.kvq_attention_rows(qf[r0:r1].data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tab.data_ptr(),
                                  tab.shape[1], rl.data_ptr(), o.data_ptr(), r1 - r0, H, KVH, D, BS, float(scale),
                                  float(softcap), kt, vt, torch.get_num_threads(), int(window), int(n != S),
                                  sk.data_ptr() if sk is not None else None):
            return kv_quant_ref.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale,
                                                softcap, max_q_len, window, k_type, v_type, sinks)
    return out.to(q.dtype)

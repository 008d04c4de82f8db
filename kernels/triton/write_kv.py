"""Scatter new K/V rows into the paged cache [NB, BS, KVH, D] at slot = block * BS + offset;
negative slots are skipped. Reference: `kernels.ref.write_kv`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import ref

reference = ref.write_kv


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, KVH, D, BS,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_cb, stride_ct, stride_ch, stride_cd,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        m = (h < KVH) & (d < D)
        dst = (slot // BS) * stride_cb + (slot % BS) * stride_ct + h * stride_ch + d * stride_cd
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=m)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=m)
        tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=m)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=m)


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_type=None, v_type=None) -> None:
    """k_type / v_type: a quantized cache's GGML type (None: float), written by kv_quant.py's kernel."""
    if k_type is not None or v_type is not None:
        from .kv_quant import write_kv as write_quant
        return write_quant(k, v, k_cache, v_cache, slot_mapping, k_type, v_type)
    T, KVH, D = k.shape
    NB, BS, _, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride()
    if T == 0:
        return
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.int64).contiguous()
    _write_kv_kernel[(T,)](
        k, v, k_cache, v_cache, slots, KVH, D, BS,
        *k.stride(), *v.stride(), *k_cache.stride(),
        BLOCK_H=triton.next_power_of_2(KVH), BLOCK_D=triton.next_power_of_2(D),
    )

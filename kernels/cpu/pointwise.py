"""RMSNorm, the fused residual add + RMSNorm, RoPE and the KV cache write on the CPU: the contracts of `kernels.ref`'s
ops, float32 CPU tensors through one C call each (`pointwise.c`), anything else (other dtypes, no
compiler) through the reference. Same arithmetic as the reference up to float32 rounding (the
mean of squares is summed in float64; cos/sin from the C library)."""
from __future__ import annotations

import torch

from .. import ref
from . import native

MAX_ROPE_PAIRS = 512  # pointwise.c's angle buffers


def _lib(*tensors: torch.Tensor):
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return None
    return native.lib()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    lib = _lib(x, weight)
    if lib is None or weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        return ref.rms_norm(x, weight, eps)
    xc, w = x.contiguous(), weight.contiguous()
    out = torch.empty_like(xc)
    C = w.shape[0]
    lib.add_rms_norm_f32(xc.data_ptr(), None, w.data_ptr(), out.data_ptr(), None, xc.numel() // C, C, float(eps),
                         torch.get_num_threads())
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    lib = _lib(x, residual, weight)
    if lib is None or weight.dim() != 1 or x.shape != residual.shape or x.shape[-1] != weight.shape[0]:
        return ref.add_rms_norm(x, residual, weight, eps)
    xc, rc, w = x.contiguous(), residual.contiguous(), weight.contiguous()
    out, s = torch.empty_like(xc), torch.empty_like(xc)
    C = w.shape[0]
    lib.add_rms_norm_f32(xc.data_ptr(), rc.data_ptr(), w.data_ptr(), out.data_ptr(), s.data_ptr(),
                         xc.numel() // C, C, float(eps), torch.get_num_threads())
    return out, s


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool,
         theta_scale: float = 0.0, mscale: float = 1.0) -> torch.Tensor:
    lib = _lib(x, inv_freq)
    R = inv_freq.shape[0]
    if lib is None or x.dim() != 3 or positions.device.type != "cpu" or R > MAX_ROPE_PAIRS or 2 * R > x.shape[2]:
        return ref.rope(x, positions, inv_freq, neox, theta_scale, mscale)
    T, NH, D = x.shape
    xc, f = x.contiguous(), inv_freq.contiguous()
    pos = positions.to(torch.int64).contiguous()
    out = torch.empty_like(xc)
    lib.rope_f32(xc.data_ptr(), pos.data_ptr(), f.data_ptr(), out.data_ptr(), T, NH, D, R, int(neox),
                 float(theta_scale), float(mscale), torch.get_num_threads())
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_type=None, v_type=None) -> None:
    """The contract of `kernels.ref.write_kv`: float32 k/v [T, KVH, D] into a float16 or float32
    cache in one C call (the reference's masking and two index_copy_ calls cost ~50 us per layer
    of a decode step); a quantized cache (k_type / v_type) through kv_quant.py."""
    if k_type is not None or v_type is not None:
        from .kv_quant import write_kv as write_quant
        return write_quant(k, v, k_cache, v_cache, slot_mapping, k_type, v_type)
    lib = _lib(k, v)
    NB, BS, KVH, D = k_cache.shape
    if (lib is None or k_cache.dtype not in (torch.float16, torch.float32) or v_cache.dtype != k_cache.dtype
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.device.type != "cpu"
            or k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (KVH, D)
            or slot_mapping.device.type != "cpu"):
        return ref.write_kv(k, v, k_cache, v_cache, slot_mapping)
    kc, vc = k.contiguous(), v.contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    bad = lib.write_kv_f32(kc.data_ptr(), vc.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                           k.shape[0], KVH * D, int(k_cache.dtype == torch.float16), NB * BS)
    if bad >= 0:
        raise IndexError(f"write_kv: slot {bad} is outside the cache ({NB * BS} slots)")


def swiglu_name() -> str | None:
    """pointwise.c's SwiGLU that computes llama.cpp's bits on this CPU: its AVX-512 branch
    ("swiglu_f32", on AVX-512F + DQ), its AVX2 + FMA branch ("swiglu_f32_avx2"), or None (the
    reference's torch silu)."""
    return {"avx512": "swiglu_f32", "avx2": "swiglu_f32_avx2"}.get(native.ggml_vector_order())


def swiglu_in_c() -> bool:
    """Whether `silu_mul` of float32 rows is one of `pointwise.c`'s SwiGLUs here (else the reference)."""
    return native.lib() is not None and swiglu_name() is not None


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up [T, F]: on a CPU where llama.cpp computes SwiGLU with its vectorized exp
    (AVX-512 or AVX2: pointwise.c, the same bits; one C call), else the reference (torch's silu)."""
    lib, name = _lib(gate, up), swiglu_name()
    if (lib is None or name is None or gate.dim() != 2 or gate.shape != up.shape
            or gate.stride(1) != 1 or up.stride(1) != 1):
        return ref.silu_mul(gate, up)
    T, n = gate.shape
    out = torch.empty((T, n), dtype=torch.float32)
    getattr(lib, name)(gate.data_ptr(), up.data_ptr(), out.data_ptr(), n, gate.stride(0), up.stride(0), n, T,
                       torch.get_num_threads())
    return out


def gelu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The reference's GeGLU (ggml's float16-table GELU) in one C call on float32 rows (the same
    bits: pointwise.c gelu_table_mul_f32), else the reference."""
    lib = _lib(gate, up)
    if lib is None or gate.dim() != 2 or gate.shape != up.shape or gate.stride(1) != 1 or up.stride(1) != 1:
        return ref.gelu_mul(gate, up)
    T, n = gate.shape
    out = torch.empty((T, n), dtype=torch.float32)
    lib.gelu_table_mul_f32(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gelu_table().data_ptr(), n,
                           gate.stride(0), up.stride(0), n, T, torch.get_num_threads())
    return out


def gelu_table() -> torch.Tensor:
    """ggml's GELU table as the C kernels read it (float32 [65536], contiguous, on the CPU)."""
    return ref._gelu_f16_table("cpu")


def rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  inv_freq: torch.Tensor, neox: bool, theta_scale: float, mscale: float, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slot_mapping: torch.Tensor, k_type=None, v_type=None) -> torch.Tensor:
    """`kernels.ref.rope_write_kv` through this module's `rope` and `write_kv` (C calls)."""
    extra = () if mscale == 1.0 else (mscale,)  # (YaRN's magnitude factor: `rope`'s last argument)
    write_kv(rope(k, positions, inv_freq, neox, theta_scale, *extra), v, k_cache, v_cache, slot_mapping, k_type, v_type)
    return rope(q, positions, inv_freq, neox, theta_scale, *extra)

"""Kernel dispatch surface (docs/DESIGN.md, "Kernel dispatch surface").

Two ways to call an op:

- `kernels.Ops(backend)` -- an explicit object: `backend="auto"` runs Triton for CUDA tensors and
  the torch reference for CPU tensors, `"torch"` always runs the reference, `"triton"` always runs
  the Triton kernels (on CPU tensors that needs TRITON_INTERPRET=1 set before triton is imported).
- module functions `kernels.qmatmul(...)` etc. -- call the module's default `Ops` ("auto" unless
  `set_backend` changed it; `set_backend` exists for tests and benchmarks, prefer `Ops`).

The Triton modules are imported lazily, on the first Triton call, so a CPU-only engine never
imports triton and tests can set TRITON_INTERPRET before the kernels are decorated.
"""
from __future__ import annotations

import torch

from . import ref
from .qweight import QWeight

BACKENDS = ("auto", "torch", "triton")
__all__ = [
    "Ops",
    "QWeight",
    "set_backend",
    "get_backend",
    "prepare_weight",
    "dequantize",
    "qmatmul",
    "embedding",
    "rms_norm",
    "add_rms_norm",
    "rope",
    "silu_mul",
    "write_kv",
    "paged_attention",
]


def _triton():
    from . import triton_ops  # lazy: imports triton

    return triton_ops


class Ops:
    """The op set for one backend; methods mirror the module-level functions."""

    def __init__(self, backend: str = "auto"):
        if backend not in BACKENDS:
            raise ValueError(f"unknown kernel backend {backend!r}; expected one of {BACKENDS}")
        self.backend = backend

    def __repr__(self) -> str:
        return f"Ops({self.backend!r})"

    def impl(self, device: torch.device):
        """The module (`kernels.ref` or `kernels.triton_ops`) that runs ops on `device`."""
        if self.backend == "torch":
            return ref
        if self.backend == "triton" or device.type == "cuda":
            return _triton()
        return ref

    def prepare_weight(self, w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
        return self.impl(w.data.device).prepare_weight(w, unpack_quantized, pack_quantized)

    def dequantize(self, w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.impl(w.data.device).dequantize(w, dtype)

    def qmatmul(self, x: torch.Tensor, w: QWeight) -> torch.Tensor:
        return self.impl(x.device).qmatmul(x, w)

    def embedding(self, ids: torch.Tensor, w: QWeight) -> torch.Tensor:
        return self.impl(w.data.device).embedding(ids, w)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.impl(x.device).rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps: float):
        return self.impl(x.device).add_rms_norm(x, residual, weight, eps)

    def rope(self, x, positions, inv_freq, neox: bool) -> torch.Tensor:
        return self.impl(x.device).rope(x, positions, inv_freq, neox)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.impl(gate.device).silu_mul(gate, up)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        return self.impl(k_cache.device).write_kv(k, v, k_cache, v_cache, slot_mapping)

    def paged_attention(
        self, q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float, softcap: float = 0.0,
        max_q_len: int | None = None,
    ) -> torch.Tensor:
        return self.impl(q.device).paged_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap, max_q_len
        )


# The single module-level default used by the module functions below (DESIGN's set_backend knob).
_default = Ops("auto")


def set_backend(backend: str) -> Ops:
    """Force the backend of the module-level functions ("auto" | "torch" | "triton")."""
    _default.__init__(backend)
    return _default


def get_backend() -> str:
    return _default.backend


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """Repack a weight once at load into the layout the backend reads fastest (CPU: float32 tiles
    or [cols, rows]; quantized ones into exact integer tiles when `pack_quantized` and the CPU
    kernel exists, else dequantized once when `unpack_quantized`; Triton: the GGUF block format
    unchanged)."""
    return _default.prepare_weight(w, unpack_quantized, pack_quantized)


def dequantize(w: QWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _default.dequantize(w, dtype)


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    return _default.qmatmul(x, w)


def embedding(ids: torch.Tensor, w: QWeight) -> torch.Tensor:
    return _default.embedding(ids, w)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _default.rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps: float):
    return _default.add_rms_norm(x, residual, weight, eps)


def rope(x, positions, inv_freq, neox: bool) -> torch.Tensor:
    return _default.rope(x, positions, inv_freq, neox)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _default.silu_mul(gate, up)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    return _default.write_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float, softcap: float = 0.0,
                    max_q_len: int | None = None):
    return _default.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap,
                                    max_q_len)

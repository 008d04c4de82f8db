"""The gated linear-attention ops on the CPU (`ssm_conv`, `gated_delta_net`, `gdn_gates`, `sigmoid`):
linear_attn.c in llama.cpp's CPU float order (its docstring), float32 CPU tensors in one C call each,
anything else (other dtypes, no compiler, a CPU whose llama.cpp build has no x86 vector branch)
through the reference (`kernels.ref_linear`)."""
from __future__ import annotations

import torch

from .. import ref_linear
from . import native
from .pointwise import silu_mul


def _lib(*tensors: torch.Tensor):
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        return None
    return native.lib()


def _lanes() -> int:
    """The vector width of llama.cpp's ggml_vec_dot_f32 on this CPU (0: none of its x86 branches)."""
    return {"avx512": 16, "avx2": 8}.get(native.ggml_vector_order(), 0)


def ssm_conv(x: torch.Tensor, w: torch.Tensor, conv_state: torch.Tensor, cells: torch.Tensor,
             cu: torch.Tensor) -> torch.Tensor:
    lib = _lib(w, conv_state) if x.dtype == torch.float32 and x.stride(1) == 1 else None
    if lib is None or _lanes() == 0:
        return ref_linear.ssm_conv(x, w, conv_state, cells, cu)
    T, C = x.shape
    cells_c = cells.to(torch.int64).contiguous()
    cu_c = cu.to(torch.int32).contiguous()
    y = torch.empty(T, C, dtype=torch.float32)
    lib.ssm_conv_f32(x.data_ptr(), x.stride(0), w.data_ptr(), conv_state.data_ptr(), cells_c.data_ptr(),
                     cu_c.data_ptr(), y.data_ptr(), cells_c.shape[0], C, w.shape[1], torch.get_num_threads())
    return silu_mul(y, torch.ones_like(y))  # ggml_vec_silu_f32: SwiGLU's SiLU times 1


def gated_delta_net(q, k, v, g, beta, state, cells, cu) -> torch.Tensor:
    qc, kc, vc, gc, bc = (t.contiguous() for t in (q, k, v, g, beta))
    lib, lanes = _lib(qc, kc, vc, gc, bc, state), _lanes()
    if lib is not None and lanes:
        T, H, D = vc.shape
        cells_c = cells.to(torch.int64).contiguous()
        cu_c = cu.to(torch.int32).contiguous()
        o = torch.empty(T, H, D, dtype=torch.float32)
        if lib.gdn_f32(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), gc.data_ptr(), bc.data_ptr(), state.data_ptr(),
                       cells_c.data_ptr(), cu_c.data_ptr(), o.data_ptr(), cells_c.shape[0], H, qc.shape[1], D, lanes,
                       torch.get_num_threads()) == 0:
            return o
    return ref_linear.gated_delta_net(q, k, v, g, beta, state, cells, cu)


def gdn_gates(b: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor):
    lib = _lib(dt_bias, A) if b.dtype == a.dtype == torch.float32 and b.stride(1) == a.stride(1) == 1 else None
    if lib is None:
        return ref_linear.gdn_gates(b, a, dt_bias, A)
    T, H = b.shape
    beta, g = torch.empty(T, H, dtype=torch.float32), torch.empty(T, H, dtype=torch.float32)
    lib.gdn_gates_f32(b.data_ptr(), b.stride(0), a.data_ptr(), a.stride(0), dt_bias.data_ptr(), A.data_ptr(),
                      beta.data_ptr(), g.data_ptr(), T, H)
    return beta, g


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    xc = x.contiguous()
    lib = _lib(xc)
    if lib is None:
        return ref_linear.sigmoid(x)
    y = torch.empty_like(xc)
    lib.sigmoid_f32(xc.data_ptr(), y.data_ptr(), xc.numel())
    return y

"""MXFP4 (GGML type 39, gpt-oss's expert weights) on the CPU, and gpt-oss's small pointwise ops, in
llama.cpp b1-0c1e570's float order (mxfp4.c, its comment): the weights stay in their GGUF blocks
("rows" layout, 4.25 bits a weight), the activations are quantized to q8_0 as llama.cpp's CPU backend
does (`qdot.quantize_activations`), each block's integer dot goes through the 16-entry value table,
and each output accumulates one fma per block. Without the compiled kernels: the reference
(dequantize, float32 matmul; not llama.cpp's order)."""
from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from .. import ref
from ..qweight import QWeight
from . import native, qdot

MXFP4 = GGMLQuantizationType.MXFP4
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = ref.SWIGLU_OAI_ALPHA, ref.SWIGLU_OAI_LIMIT


def supported(w: QWeight) -> bool:
    return (w.qtype == MXFP4 and w.layout == "rows" and w.data.device.type == "cpu" and w.cols % 32 == 0
            and w.data.stride(1) == 1 and native.lib() is not None and qdot.available())


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y [T, rows] = x [T, cols] @ W^T for an MXFP4 weight, in x.dtype (llama.cpp's order)."""
    if not supported(w):
        return ref.qmatmul(x, w)
    T = x.shape[0]
    out = torch.empty((T, w.rows), dtype=torch.float32)
    if T:
        acts = qdot.quantize_activations(x.float(), "q8_0")
        native.lib().mxfp4_q8_0_matmul(w.data.data_ptr(), w.data.stride(0), w.rows, w.cols, acts.q.data_ptr(),
                                       acts.d.data_ptr(), T, out.data_ptr(), w.rows, torch.get_num_threads())
    return out.to(x.dtype)


def router_matmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """logits [T, rows] float32 = x [T, cols] @ W^T for a mixture-of-experts router: an F32 "rows"
    weight in llama.cpp's F32 order where this CPU's llama.cpp build takes the AVX2 one (one row:
    ggml_vec_dot_f32, more: llamafile's tinyBLAS, mxfp4.c); anything else through `qmatmul`."""
    from .matmul import qmatmul

    lib = native.lib()
    T = x.shape[0]
    if (lib is None or w.qtype != GGMLQuantizationType.F32 or w.layout != "rows" or w.data.device.type != "cpu"
            or native.ggml_vector_order() != "avx2" or (T > 1 and w.cols % 8) or w.data.stride(1) != 1):
        return qmatmul(x.float(), w).float()
    xf = x.float().contiguous()
    out = torch.empty((T, w.rows), dtype=torch.float32)
    if T:
        lib.f32_matmul_ggml_avx2(w.data.data_ptr(), w.data.stride(0), w.rows, w.cols, xf.data_ptr(), xf.stride(0), T,
                                 out.data_ptr(), w.rows, torch.get_num_threads())
    return out


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_OAI_ALPHA,
               limit: float = SWIGLU_OAI_LIMIT) -> torch.Tensor:
    """ggml_swiglu_oai(gate, up) [.., F] float32: min(g, limit) * sigmoid(alpha * min(g, limit)) *
    (clamp(u, -limit, limit) + 1), with glibc's expf as llama.cpp's CPU op."""
    lib = native.lib()
    if lib is None or gate.device.type != "cpu":
        return ref.swiglu_oai(gate, up, alpha, limit)
    g = gate.float().contiguous()
    u = up.float().contiguous()
    out = torch.empty_like(g)
    lib.swiglu_oai_f32(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), float(alpha), float(limit))
    return out


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """ggml_soft_max over the last dim of x [T, k] float32 (k < 8: llama.cpp's scalar path, exact;
    otherwise torch's)."""
    lib = native.lib()
    if lib is None or x.device.type != "cpu" or x.shape[-1] >= 8:
        return torch.softmax(x.float(), dim=-1)
    y = x.float().contiguous().clone()
    lib.softmax_small_f32(y.data_ptr(), y.shape[0], y.shape[1])
    return y

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
SWIGLU_OAI_ALPHA = 1.702  # llama.cpp's build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE
SWIGLU_OAI_LIMIT = 7.0


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


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_OAI_ALPHA,
               limit: float = SWIGLU_OAI_LIMIT) -> torch.Tensor:
    """ggml_swiglu_oai(gate, up) [.., F] float32: min(g, limit) * sigmoid(alpha * min(g, limit)) *
    (clamp(u, -limit, limit) + 1), with glibc's expf as llama.cpp's CPU op."""
    lib = native.lib()
    if lib is None or gate.device.type != "cpu":
        return ref_swiglu_oai(gate, up, alpha, limit)
    g = gate.float().contiguous()
    u = up.float().contiguous()
    out = torch.empty_like(g)
    lib.swiglu_oai_f32(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), float(alpha), float(limit))
    return out


def ref_swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_OAI_ALPHA,
                   limit: float = SWIGLU_OAI_LIMIT) -> torch.Tensor:
    """The same in torch (any device; torch's exp, not glibc's: within an ulp)."""
    x = gate.float().clamp(max=limit)
    y = up.float().clamp(-limit, limit)
    return x / (1.0 + torch.exp(alpha * -x)) * (y + 1.0)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """ggml_soft_max over the last dim of x [T, k] float32 (k < 8: llama.cpp's scalar path, exact;
    otherwise torch's)."""
    lib = native.lib()
    if lib is None or x.device.type != "cpu" or x.shape[-1] >= 8:
        return torch.softmax(x.float(), dim=-1)
    y = x.float().contiguous().clone()
    lib.softmax_small_f32(y.data_ptr(), y.shape[0], y.shape[1])
    return y

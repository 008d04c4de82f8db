"""Mixture-of-experts FFN on the CPU: each expert prepared once at load like any other matmul
weight (its gate and up as one `prepare_weights` group, its down by `prepare_weight`: integer-dot
panels for the quantized types qdot has, float tiles / BLAS layouts otherwise), and per step the
tokens grouped by expert (`ref.moe_grouped`), so that each used expert's weights are read once for
all the tokens routed to it: one gate+up matmul, SiLU, one down matmul per used expert. Routing
is the reference's (`ref.moe_route`, torch)."""
from __future__ import annotations

import torch

from .. import ref
from ..numerics import Numerics
from ..qweight import Experts, QWeight
from . import mxfp4
from .matmul import prepare_weight, prepare_weights, qmatmul


def prepare_experts(gate: QWeight, up: QWeight, down: QWeight, n_expert: int, unpack_quantized: bool = False,
                    pack_quantized: bool = True, numerics: Numerics = Numerics.GGML) -> Experts:
    """Once at load: every expert's weights split out of the stacked tensors and prepared (their
    qdot groups in `numerics`)."""
    if gate.data.device.type != "cpu":
        return ref.prepare_experts(gate, up, down, n_expert, unpack_quantized, pack_quantized)
    n_ff, n_embd = gate.rows // n_expert, gate.cols
    split = []
    for e in range(n_expert):
        gu = prepare_weights([Experts.rows_of(gate, e, n_ff), Experts.rows_of(up, e, n_ff)],
                             unpack_quantized, pack_quantized, numerics)
        split.append((gu, prepare_weight(Experts.rows_of(down, e, n_embd), unpack_quantized, pack_quantized, numerics)))
    return Experts(n_expert, n_ff, n_embd, None, None, None, split)


def moe_route(logits: torch.Tensor, k: int, norm: bool = True, scale: float = 0.0, softmax_after: bool = False):
    """`kernels.ref.moe_route`; after the top k, the softmax over k < 8 values as llama.cpp's CPU
    ggml_soft_max (glibc expf, a double sum) (mxfp4.c)."""
    return ref.moe_route(logits, k, norm, scale, softmax_after, mxfp4.softmax_rows if softmax_after else None)


def moe_ffn(x: torch.Tensor, experts: Experts, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`kernels.ref.moe_ffn`'s contract, one matmul per used expert over its tokens (gpt-oss's biased
    experts: `ref.moe_biased` with these matmuls, MXFP4 through mxfp4.c, and its C swiglu_oai)."""
    if experts.split is None:
        return ref.moe_ffn(x, experts, weights, ids)
    if experts.bias is not None:
        return ref.moe_biased(x, experts, weights, ids, qmatmul,
                              mxfp4.swiglu_oai if experts.act == "swiglu_oai" else ref.silu_mul)
    F = experts.n_ff

    def expert(e: int, xe: torch.Tensor) -> torch.Tensor:
        gu_w, down = experts.split[e]
        xf = xe.float()
        gu = torch.cat([qmatmul(xf, w) for w in gu_w], dim=1) if len(gu_w) > 1 else qmatmul(xf, gu_w[0])
        return qmatmul(ref.silu_mul(gu[:, :F], gu[:, F:]), down)

    return ref.moe_grouped(x, weights, ids, expert)

"""qwen3moe as llama.cpp b1-0c1e570 computes it (src/models/qwen3moe.cpp, llm_graph_context::build_moe_ffn).

- attention: qwen3's (RMSNorm of q and k per head before NEOX RoPE, no biases, scale 1/sqrt(head_dim));
- FFN: a mixture of experts in every layer. Router logits `ffn_gate_inp` [n_expert, n_embd] (F32 in
  llama.cpp's quantized files) -> softmax over all experts (float32) -> the `expert_used_count`
  largest probabilities -> divided by their sum (norm_w = true; the sum clamped below at
  6.103515625e-5) -> each chosen expert's SwiGLU FFN, down(silu(gate x) * up x), weighted and
  summed. Experts are the 3-D tensors `ffn_{gate,up,down}_exps` (GGUF ne [n_embd, n_ff_exp, n_expert]
  / [n_ff_exp, n_embd, n_expert]; the loader keeps them as one QWeight of every expert's rows
  stacked, expert e's rows at e * rows_per_expert); any GGUF type the kernels dequantize.
  `expert_feed_forward_length` is each expert's FFN length (absent: feed_forward_length / used).
  qwen3moe reads no `expert_weights_scale` and has no shared expert nor expert groups.

The expert computation is the kernels' (`moe_route`, `prepare_experts`, `moe_ffn` of the dispatch
surface): the CPU groups the tokens by expert and reads each used expert's weights once per step,
Triton runs one fused grouped GEMM over the tokens sorted by expert (kernels/triton/moe_gemm.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import kernels
from kernels.qweight import Experts, QWeight

ARCHS = ("qwen3moe",)


def configure(md: dict[str, Any], cfg) -> None:
    arch = cfg.arch
    n_expert = int(md.get(f"{arch}.expert_count", 0) or 0)
    n_used = int(md.get(f"{arch}.expert_used_count", 0) or 0)
    if n_expert <= 0 or n_used <= 0:
        raise ValueError(f"{arch}: expert_count and expert_used_count must be > 0 "
                         f"(got {n_expert}, {n_used})")
    if n_used > n_expert:
        raise ValueError(f"{arch}: expert_used_count {n_used} > expert_count {n_expert}")
    cfg.n_expert = n_expert
    cfg.n_expert_used = n_used
    cfg.n_ff_exp = int(md.get(f"{arch}.expert_feed_forward_length", 0) or 0) or cfg.n_ff // n_used
    cfg.expert_weights_norm = True  # build_moe_ffn(..., norm_w = true, w_scale = hparams' 0: none)
    cfg.expert_weights_scale = 0.0


def spec_fields(cfg) -> dict[str, Any]:
    return dict(moe=True)


def expert_weights(w: dict, prefix: str, cfg, device) -> tuple[QWeight, QWeight, QWeight]:
    """A layer's stacked expert matrices (gate, up, down) on `device`, their shapes checked against
    the config: gate / up [n_expert * n_ff_exp, n_embd], down [n_expert * n_embd, n_ff_exp]."""
    names = [prefix + f"ffn_{n}_exps.weight" for n in ("gate", "up", "down")]
    gate, up, down = (w[n].to(device) for n in names)
    E, F, C = cfg.n_expert, cfg.n_ff_exp, cfg.n_embd
    if (gate.rows, gate.cols) != (E * F, C) or (up.rows, up.cols) != (E * F, C) or (down.rows, down.cols) != (E * C, F):
        raise ValueError(f"{prefix}ffn_*_exps: shapes {[(x.rows, x.cols) for x in (gate, up, down)]} do not "
                         f"match {E} experts of {F} x {C}")
    return gate, up, down


@dataclass
class MoeFFN:
    """One layer's mixture-of-experts FFN, its weights as the model's backend prepared them."""
    router: QWeight  # [n_expert, n_embd]
    experts: Experts
    n_used: int
    norm: bool
    scale: float

    @classmethod
    def load(cls, ops: kernels.Backend, w: dict, prefix: str, cfg, device, unpack: bool, pack: bool) -> "MoeFFN":
        gate, up, down = expert_weights(w, prefix, cfg, device)
        router = ops.prepare_weight(w[prefix + "ffn_gate_inp.weight"].to(device), unpack, pack)
        return cls(router, ops.prepare_experts(gate, up, down, cfg.n_expert, unpack, pack), cfg.n_expert_used,
                   cfg.expert_weights_norm, cfg.expert_weights_scale)

    def __call__(self, ops: kernels.Backend, x: torch.Tensor) -> torch.Tensor:
        """x [T, C] (the normed FFN input) -> [T, C] in x.dtype."""
        logits = ops.qmatmul(x.float(), self.router)  # [T, E] float32, as llama.cpp's F32 router
        weights, ids = ops.moe_route(logits, self.n_used, self.norm, self.scale)
        return ops.moe_ffn(x, self.experts, weights, ids)

"""gpt-oss (`gpt-oss`, LLM_ARCH_OPENAI_MOE) as llama.cpp b1-0c1e570 computes it (src/models/openai-moe.cpp,
llm_graph_context::build_moe_ffn, build_attn with sinks).

Every layer: h += attn(rms_norm(h, attn_norm)); h += moe(rms_norm(h, post_attention_norm)) (the
loader names that norm `ffn_norm`, so the decoder's loop is the usual pre-norm one).

- attention: q/k/v with biases (`attn_{q,k,v}.bias`), NEOX RoPE over the whole head (`n_rot`;
  YaRN in the released models), scale 1/sqrt(n_rot), one learned sink logit per head
  (`attn_sinks.weight` [n_head]: an extra softmax entry with no value), output projection with a
  bias (`attn_output.bias`). Layers alternate a sliding window and full attention
  (`attention.sliding_window`, llama.cpp's set_swa_pattern(2): even layers local, unless
  `attention.sliding_window_pattern` says otherwise), LLAMA_SWA_TYPE_STANDARD; the local layers'
  RoPE is the global one (`rope.freq_base_swa` defaults to `rope.freq_base`; a file with another
  value is refused).
- MoE (`GptOssMoE`): router `ffn_gate_inp` plus its bias -> the `expert_used_count` largest logits
  -> softmax over those (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, no norm_w, no scale); each
  chosen expert: gate = W_g x + b_g, up = W_u x + b_u (`ffn_{gate,up}_exps.bias` [n_expert,
  n_ff_exp]), swiglu_oai(gate, up) (x = min(gate, 7), y = clamp(up, -7, 7), x sigmoid(1.702 x)
  (y + 1)), down = W_d . + b_d; weighted, summed over the slots in order. Experts are MXFP4 in the
  released files (any type the kernels read works).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

import kernels
from kernels.qweight import Experts, QWeight
from runtime.model.arch.gemma import _swa_layers
from runtime.model.arch.qwen35 import _key
from runtime.model.arch.qwen3moe import expert_weights

ARCHS = ("gpt-oss",)


def configure(md: dict[str, Any], cfg) -> None:
    a = cfg.arch
    n_expert = int(md.get(f"{a}.expert_count", 0) or 0)
    n_used = int(md.get(f"{a}.expert_used_count", 0) or 0)
    if n_expert <= 0 or not 0 < n_used <= n_expert:
        raise ValueError(f"{a}: expert_count and expert_used_count must satisfy 0 < used <= count "
                         f"(got {n_expert}, {n_used})")
    cfg.n_expert, cfg.n_expert_used = n_expert, n_used
    cfg.n_ff_exp = int(_key(md, a, "expert_feed_forward_length"))
    cfg.expert_weights_norm = False
    cfg.expert_weights_scale = 0.0
    cfg.sliding_window = int(_key(md, a, "attention.sliding_window"))
    cfg.swa_layers = _swa_layers(md, a, cfg.n_layer, 2)
    base_swa = float(md.get(f"{a}.rope.freq_base_swa", cfg.rope_freq_base))
    if base_swa != cfg.rope_freq_base:
        raise ValueError(f"{a}: rope.freq_base_swa {base_swa} differs from rope.freq_base {cfg.rope_freq_base}: "
                         "local layers with their own RoPE base are not supported for gpt-oss")
    if cfg.n_rot != cfg.head_dim:
        raise ValueError(f"{a}: rope.dimension_count {cfg.n_rot} != head dim {cfg.head_dim} is not supported")


def spec_fields(cfg) -> dict[str, Any]:
    windows = [cfg.sliding_window if s else 0 for s in (cfg.swa_layers or [])] if cfg.sliding_window else []
    return dict(moe=True, windows=windows)


def split_weights(cfg, weights: dict[str, Any]) -> None:
    """`post_attention_norm` is the FFN's input norm here: named `ffn_norm` for the decoder."""
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "post_attention_norm.weight" in weights:
            weights[p + "ffn_norm.weight"] = weights.pop(p + "post_attention_norm.weight")


def _vec(w: dict, name: str, shape: tuple[int, ...], device) -> torch.Tensor:
    t = w.get(name)
    if t is None:
        raise ValueError(f"gpt-oss: missing tensor {name}")
    t = kernels.dequantize(t) if isinstance(t, QWeight) else t  # 2-D biases load as matrices
    t = t.to(device=device, dtype=torch.float32).reshape(shape)
    return t.contiguous()


@dataclass
class GptOssMoE:
    """One layer's experts, their weights as the model's backend prepared them."""
    router: QWeight  # [n_expert, n_embd], GGUF layout
    router_b: torch.Tensor  # [n_expert] float32
    experts: Experts  # with bias (gate, up, down) and act "swiglu_oai"
    n_used: int

    @classmethod
    def load(cls, ops: kernels.Backend, w: dict, prefix: str, cfg, device, unpack: bool, pack: bool) -> "GptOssMoE":
        gate, up, down = expert_weights(w, prefix, cfg, device)
        E, F, C = cfg.n_expert, cfg.n_ff_exp, cfg.n_embd
        bias = (_vec(w, prefix + "ffn_gate_exps.bias", (E, F), device), _vec(w, prefix + "ffn_up_exps.bias", (E, F), device),
                _vec(w, prefix + "ffn_down_exps.bias", (E, C), device))
        experts = dataclasses.replace(ops.prepare_experts(gate, up, down, E, unpack, pack), bias=bias, act="swiglu_oai")
        router = w[prefix + "ffn_gate_inp.weight"].to(device)  # GGUF layout: kernels.router_matmul reads it
        return cls(router, _vec(w, prefix + "ffn_gate_inp.bias", (E,), device), experts, cfg.n_expert_used)

    def __call__(self, ops: kernels.Backend, x: torch.Tensor) -> torch.Tensor:
        """x [T, C] (the normed FFN input) -> [T, C] in x.dtype."""
        logits = ops.router_matmul(x, self.router) + self.router_b  # [T, E] (F32 router: llama.cpp's order on the CPU)
        weights, ids = ops.moe_route(logits, self.n_used, False, 0.0, True)
        return ops.moe_ffn(x, self.experts, weights, ids)

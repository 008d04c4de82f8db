"""Tensor lists and GGUF keys of the tiny random models of the hybrid / newer architectures, in
llama.cpp b1-0c1e570's layout (src/models/<arch>.cpp `load_arch_tensors`, src/llama-arch.cpp names,
gguf-py's writer keys); `runtime/model/tiny_model.py` writes them.

- qwen35 / qwen35moe (Qwen3.5 / 3.6): layer il is a gated linear-attention (gated delta net) layer
  unless (il + 1) % full_attention_interval == 0. Linear layers: `attn_qkv` [2 key_dim + value_dim,
  n_embd] (q, k, v channels of the short convolution), `attn_gate` (z) [value_dim, n_embd],
  `ssm_conv1d` [conv_dim, d_conv] (kept F32, as llama.cpp's quantizer keeps it), `ssm_dt.bias`
  [H_v], `ssm_a` [H_v] (-exp(A_log): negative), `ssm_beta` / `ssm_alpha` [H_v, n_embd],
  `ssm_norm` [head_v_dim], `ssm_out` [n_embd, value_dim]. Full-attention layers: `attn_q`
  [2 H D, n_embd] (per head D query rows then D gate rows), `attn_k` / `attn_v` [KVH D, n_embd],
  `attn_q_norm` / `attn_k_norm` [D], `attn_output` [n_embd, H D]. Every layer: `attn_norm`,
  `post_attention_norm` (the FFN's input norm), then the FFN: SwiGLU `ffn_gate/up/down` (qwen35)
  or routed experts `ffn_{gate,up,down}_exps` + router `ffn_gate_inp` and a shared expert
  `ffn_{gate,up,down}_shexp` with its 1-D sigmoid gate `ffn_gate_inp_shexp` [n_embd] (qwen35moe).
  RoPE: IMROPE (`rope.dimension_sections`) over `rope.dimension_count` = head_dim / 4 dims.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGUFValueType

HYBRID_ARCHS = ("qwen35", "qwen35moe")
ARCHS = HYBRID_ARCHS


def is_recurrent(spec, il: int) -> bool:
    return (il + 1) % spec.full_attn_interval != 0


def n_rot(spec) -> int:
    hd = spec.head_dim or spec.n_embd // spec.n_head
    return spec.n_rot or hd // 4


def tensor_shapes(spec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape) of every tensor of a tiny model of `spec.arch` (one of ARCHS)."""
    hd = spec.head_dim or spec.n_embd // spec.n_head
    C = spec.n_embd
    S, Hk, Hv = spec.ssm_state, spec.ssm_groups, spec.ssm_dt_rank
    key_dim, value_dim = S * Hk, S * Hv
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, C))]
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", (C,)))
        out.append((p + "post_attention_norm.weight", (C,)))
        if is_recurrent(spec, il):
            out += [(p + "attn_qkv.weight", (2 * key_dim + value_dim, C)), (p + "attn_gate.weight", (value_dim, C)),
                    (p + "ssm_conv1d.weight", (2 * key_dim + value_dim, spec.ssm_conv)), (p + "ssm_dt.bias", (Hv,)),
                    (p + "ssm_a", (Hv,)), (p + "ssm_beta.weight", (Hv, C)), (p + "ssm_alpha.weight", (Hv, C)),
                    (p + "ssm_norm.weight", (S,)), (p + "ssm_out.weight", (C, value_dim))]
        else:
            out += [(p + "attn_q.weight", (2 * spec.n_head * hd, C)), (p + "attn_k.weight", (spec.n_head_kv * hd, C)),
                    (p + "attn_v.weight", (spec.n_head_kv * hd, C)), (p + "attn_output.weight", (C, spec.n_head * hd)),
                    (p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]
        if spec.arch == "qwen35moe":
            E, F, Fs = spec.n_expert, spec.n_ff_exp, spec.n_ff_shexp or spec.n_ff
            out += [(p + "ffn_gate_inp.weight", (E, C)), (p + "ffn_gate_exps.weight", (E, F, C)),
                    (p + "ffn_up_exps.weight", (E, F, C)), (p + "ffn_down_exps.weight", (E, C, F)),
                    (p + "ffn_gate_inp_shexp.weight", (C,)), (p + "ffn_gate_shexp.weight", (Fs, C)),
                    (p + "ffn_up_shexp.weight", (Fs, C)), (p + "ffn_down_shexp.weight", (C, Fs))]
        else:
            out += [(p + "ffn_gate.weight", (spec.n_ff, C)), (p + "ffn_up.weight", (spec.n_ff, C)),
                    (p + "ffn_down.weight", (C, spec.n_ff))]
    out.append(("output_norm.weight", (C,)))
    if not spec.tie_embeddings:
        out.append(("output.weight", (n_vocab, C)))
    return out


def write_keys(w, spec) -> None:
    """The architecture's own GGUF keys (after the common ones tiny_model writes)."""
    a = spec.arch
    if spec.ssm_state * spec.ssm_dt_rank == 0 or spec.ssm_dt_rank % spec.ssm_groups:
        raise ValueError(f"{a}: ssm_dt_rank (value heads) must be a positive multiple of ssm_groups (key heads)")
    w.add_ssm_conv_kernel(spec.ssm_conv)
    w.add_ssm_state_size(spec.ssm_state)
    w.add_ssm_group_count(spec.ssm_groups)
    w.add_ssm_time_step_rank(spec.ssm_dt_rank)
    w.add_ssm_inner_size(spec.ssm_state * spec.ssm_dt_rank)
    w.add_full_attention_interval(spec.full_attn_interval)
    w.add_key_value(f"{a}.rope.dimension_sections", list(spec.rope_sections or (3, 3, 2, 0)), GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.INT32)
    if a == "qwen35moe":
        if not 0 < spec.n_expert_used <= spec.n_expert:
            raise ValueError(f"{a} needs 0 < n_expert_used <= n_expert")
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
        w.add_expert_shared_feed_forward_length(spec.n_ff_shexp or spec.n_ff)


def one_d(name: str, shape: tuple[int, ...], rng: np.random.Generator, spec) -> np.ndarray | None:
    """Values of the architecture's own 1-D tensors (None: tiny_model's default for the name)."""
    if name.endswith(".ssm_a"):  # -exp(A_log), A_log ~ N(0, 0.5): decays of exp(softplus(.) * a) in (0, 1)
        return (-np.exp(rng.standard_normal(shape, dtype=np.float32) * 0.5)).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(np.float32)
    if name.endswith("ffn_gate_inp_shexp.weight"):
        return (rng.standard_normal(shape, dtype=np.float32) * spec.init_std * 4).astype(np.float32)
    return None


def keeps_f32(name: str) -> bool:
    """Matrices llama.cpp's quantizer leaves alone (beyond norms and routers): the short conv."""
    return "ssm_conv1d" in name


def std_of(name: str, spec) -> float | None:
    """The random scale of a matrix when it is not the spec's init_std (None)."""
    if "ssm_conv1d" in name:
        return 0.3  # a 4-tap filter whose taps matter
    return None


__all__: list[Any] = ["ARCHS", "HYBRID_ARCHS", "tensor_shapes", "write_keys", "one_d", "keeps_f32", "std_of",
                      "is_recurrent", "n_rot"]

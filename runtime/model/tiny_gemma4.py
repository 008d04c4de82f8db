"""Tensor list and GGUF keys of the tiny random `gemma4` models, in llama.cpp b1-0c1e570's layout
(src/models/gemma4.cpp `load_arch_tensors`, src/llama-arch.cpp names, the keys conversion/gemma.py's
Gemma4Model writes); `runtime/model/tiny_model.py` writes them.

Layer il is a sliding-window layer unless (il + 1) % `gemma4_swa_period` == 0 (the
`attention.sliding_window_pattern` array); sliding layers have heads of `head_dim_swa` with all
`head_dim_swa` dims rotated (`rope.dimension_count_swa`), full layers heads of `head_dim` with the
"proportional" RoPE: `rope.dimension_count` = head_dim and `rope_freqs` [head_dim / 2] holding 1 for
the first `gemma4_rope_partial` of the pairs and 1e30 for the others (as the converter writes it).
The last `gemma4_shared_kv` layers have no `attn_k` / `attn_v` / `attn_k_norm` (they read the cache
of an earlier layer) and, with `gemma4_double_mlp`, an FFN twice as long (`feed_forward_length`
array). Full layers with a KV cache have no `attn_v` when `gemma4_k_eq_v` (v = the k projection).
`n_embd_per_layer` > 0: `per_layer_token_embd` [n_vocab, n_layer P], `per_layer_model_proj`
[n_layer P, n_embd], `per_layer_proj_norm` [P] and per layer `inp_gate` [P, n_embd], `proj`
[n_embd, P], `post_norm` [n_embd]. Every layer: `attn_norm`, `attn_q`, `attn_q_norm`,
`attn_output`, `post_attention_norm`, `ffn_norm`, `ffn_gate/up/down`, `post_ffw_norm`,
`layer_output_scale` [1].
"""
from __future__ import annotations

from typing import Any

import numpy as np

ARCHS = ("gemma4",)


def is_swa(spec, il: int) -> bool:
    return (il + 1) % spec.gemma4_swa_period != 0


def n_kv(spec) -> int:
    return spec.n_layer - spec.gemma4_shared_kv


def n_ff(spec, il: int) -> int:
    return spec.n_ff * 2 if spec.gemma4_double_mlp and il >= n_kv(spec) else spec.n_ff


def head_dims(spec) -> tuple[int, int]:
    """(full layers' head size, sliding layers')."""
    full = spec.head_dim or spec.n_embd // spec.n_head
    return full, spec.head_dim_swa or full // 2


def tensor_shapes(spec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    C, H, KVH, P, L = spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_embd_per_layer, spec.n_layer
    full, swa = head_dims(spec)
    out: list[tuple[str, tuple[int, ...]]] = [("rope_freqs.weight", (full // 2,)), ("token_embd.weight", (n_vocab, C))]
    if P:
        out += [("per_layer_token_embd.weight", (n_vocab, L * P)), ("per_layer_model_proj.weight", (L * P, C)),
                ("per_layer_proj_norm.weight", (P,))]
    for il in range(L):
        p = f"blk.{il}."
        D = swa if is_swa(spec, il) else full
        has_kv = il < n_kv(spec)
        F = n_ff(spec, il)
        out += [(p + "attn_norm.weight", (C,)), (p + "attn_q.weight", (H * D, C))]
        if has_kv:
            out.append((p + "attn_k.weight", (KVH * D, C)))
            if is_swa(spec, il) or not spec.gemma4_k_eq_v:
                out.append((p + "attn_v.weight", (KVH * D, C)))
        out += [(p + "attn_output.weight", (C, H * D)), (p + "attn_q_norm.weight", (D,))]
        if has_kv:
            out.append((p + "attn_k_norm.weight", (D,)))
        out += [(p + "post_attention_norm.weight", (C,)), (p + "layer_output_scale.weight", (1,)),
                (p + "ffn_norm.weight", (C,)), (p + "ffn_gate.weight", (F, C)), (p + "ffn_up.weight", (F, C)),
                (p + "ffn_down.weight", (C, F)), (p + "post_ffw_norm.weight", (C,))]
        if P:
            out += [(p + "inp_gate.weight", (P, C)), (p + "proj.weight", (C, P)), (p + "post_norm.weight", (C,))]
    out.append(("output_norm.weight", (C,)))
    if not spec.tie_embeddings:
        out.append(("output.weight", (n_vocab, C)))
    return out


def ff_length(spec) -> int | list[int]:
    """`feed_forward_length`: per layer with the double-wide MLP (as the converter writes it)."""
    return [n_ff(spec, il) for il in range(spec.n_layer)] if spec.gemma4_double_mlp else spec.n_ff


def write_keys(w, spec) -> None:
    """gemma4's own keys (after the common ones tiny_model writes; it writes key_length = the full
    layers' head size and rope.dimension_count = that too)."""
    a = spec.arch
    full, swa = head_dims(spec)
    L = spec.n_layer
    if not 0 <= spec.gemma4_shared_kv <= L - 2:
        raise ValueError(f"{a}: shared KV layers must leave at least 2 layers with a KV cache")
    w.add_key_length_swa(swa)
    w.add_value_length_swa(swa)
    w.add_rope_dimension_count_swa(swa)
    w.add_sliding_window_pattern([is_swa(spec, il) for il in range(L)])
    w.add_shared_kv_layers(spec.gemma4_shared_kv)
    w.add_embedding_length_per_layer_input(spec.n_embd_per_layer)
    if spec.final_softcap:
        w.add_final_logit_softcapping(spec.final_softcap)


def one_d(name: str, shape: tuple[int, ...], rng: np.random.Generator, spec) -> np.ndarray | None:
    if name == "rope_freqs.weight":
        n_rot = int(shape[0] * spec.gemma4_rope_partial)
        return np.array([1.0] * n_rot + [1e30] * (shape[0] - n_rot), dtype=np.float32)
    if name.endswith("layer_output_scale.weight"):
        return (0.5 + rng.random(shape, dtype=np.float32)).astype(np.float32)
    return None


__all__: list[Any] = ["ARCHS", "tensor_shapes", "write_keys", "ff_length", "one_d", "is_swa", "n_kv", "head_dims"]

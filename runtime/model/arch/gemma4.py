"""Gemma 4 (`gemma4`), the dense models (E2B / E4B / 31B shapes), as llama.cpp b1-0c1e570's
src/models/gemma4.cpp computes them.

What tritium takes from gemma4.cpp (and llama-model.cpp / llama-hparams.cpp for its keys):
- token embeddings scaled by sqrt(n_embd); per-layer token embeddings (`per_layer_token_embd`
  [n_vocab, n_layer P] rows times sqrt(P)) plus the projection of the scaled embeddings
  (`per_layer_model_proj` times 1/sqrt(n_embd), RMSNormed per layer with `per_layer_proj_norm`),
  summed and times 1/sqrt(2): one [P] input per layer (`PerLayerEmbedding`); after each layer's FFN
  residual: h += post_norm(proj(gelu(inp_gate h) * input_l)) (`LayerInput`);
- sliding-window and full layers (`attention.sliding_window_pattern`, window
  `attention.sliding_window`) with their own head sizes (`key_length_swa` / `key_length`), RoPE
  dims (`rope.dimension_count_swa` / `rope.dimension_count`) and bases (`rope.freq_base_swa` /
  `rope.freq_base`); NEOX RoPE; the full layers' "proportional" RoPE through `rope_freqs` (factors
  1 on the rotated pairs, 1e30 on the others: angles ~0);
- q and k RMSNormed per head (`attn_q_norm`, `attn_k_norm`), v RMSNormed per head without a weight,
  v = the k projection where a layer has no `attn_v`; attention scale 1 (f_attention_scale);
- KV shared across the last `attention.shared_kv_layers` layers: a layer il >= n_layer - shared
  computes q only and reads the cache of layer n_kv - 2 (sliding) or n_kv - 1 (full), as
  llama_model's layer_reuse_cb (`kv_src`);
- post-attention / post-FFN RMSNorms, GeGLU FFN whose length may differ per layer
  (`feed_forward_length` array: the double-wide MLP of the KV-shared layers), the layer output
  times `layer_output_scale`, the output soft-capped by `final_logit_softcapping` (llama.cpp's
  default 30 when the key is missing).

What differs: the KV store keeps one head size, the largest (the full layers'); a sliding layer's
q / k / v are zero-padded to it before the cache and the attention (exact: zeros add nothing to
q.k, and the padded output columns are dropped), so its cache rows are wider than llama.cpp's
(slot files of gemma4 are therefore not llama.cpp's byte layout). A KV-shared layer keeps an
(unwritten) place in the store. Not handled (refused at load): the MoE variant (26B-A4B:
`expert_count`), layers with different KV head counts, fused `attn_qkv` files; not used: the
vision / audio paths (media rows of llama.cpp take the padding token's per-layer embedding), the
bidirectional SWA of vision inputs, MTP heads. Tensor parallelism (-tp) is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import kernels
from kernels.qweight import QWeight
from runtime.model.rope import rope_inv_freq, rope_theta_scale

ARCHS = ("gemma4",)


def _list(v: Any, n: int) -> list:
    return [v[i] if i < len(v) else v[-1] for i in range(n)] if isinstance(v, list) else [v] * n


def configure(md: dict[str, Any], cfg) -> None:
    a = cfg.arch
    if md.get(f"{a}.expert_count"):
        raise ValueError(f"{a}: the mixture-of-experts variant (26B-A4B) is not supported by tritium")
    pattern = md.get(f"{a}.attention.sliding_window_pattern")
    if not isinstance(pattern, list):
        raise ValueError(f"key not found in model: {a}.attention.sliding_window_pattern")
    for key in ("attention.sliding_window", "attention.key_length_swa", "embedding_length_per_layer_input"):
        if f"{a}.{key}" not in md:
            raise ValueError(f"key not found in model: {a}.{key}")
    L = cfg.n_layer
    cfg.swa_layers = [bool(x) for x in _list(pattern, L)]
    cfg.sliding_window = int(md[f"{a}.attention.sliding_window"])
    cfg.rope_freq_base_swa = float(np.float32(md.get(f"{a}.rope.freq_base_swa", 10000.0)))
    cfg.head_dim_swa = int(md[f"{a}.attention.key_length_swa"])
    if int(md.get(f"{a}.attention.value_length_swa", cfg.head_dim_swa)) != cfg.head_dim_swa or \
            int(md.get(f"{a}.attention.value_length", cfg.head_dim)) != cfg.head_dim:
        raise ValueError("Gemma 4 requires n_embd_head_k == n_embd_head_v")
    cfg.n_rot_swa = int(md.get(f"{a}.rope.dimension_count_swa", cfg.n_rot or cfg.head_dim))
    shared = int(md.get(f"{a}.attention.shared_kv_layers", 0) or 0)
    cfg.n_layer_kv = L - shared
    if shared and cfg.n_layer_kv < 2:
        raise ValueError(f"{a}: {shared} KV-shared layers of {L} leave fewer than 2 layers with a KV cache")
    kvh = [int(x) for x in _list(md.get(f"{a}.attention.head_count_kv", cfg.n_head), L)]
    if len(set(kvh)) != 1:
        raise ValueError(f"{a}: layers with different KV head counts ({sorted(set(kvh))}) are not supported by tritium")
    cfg.n_head_kv = kvh[0]
    cfg.n_ff_layers = [int(x) for x in _list(md.get(f"{a}.feed_forward_length"), L)]
    cfg.n_embd_per_layer = int(md[f"{a}.embedding_length_per_layer_input"])
    cap = md.get(f"{a}.final_logit_softcapping")
    cfg.final_logit_softcap = 30.0 if cap is None else float(np.float32(cap))
    cfg.attn_logit_softcap = 0.0
    check_source(cfg)


def kv_source(cfg, il: int) -> int:
    """The layer whose K/V layer il attends to (itself unless KV-shared: llama_model's layer_reuse_cb)."""
    if il < cfg.n_layer_kv:
        return il
    return cfg.n_layer_kv - (2 if cfg.swa_layers[il] else 1)


def spec_fields(cfg) -> dict[str, Any]:
    swa = cfg.swa_layers
    return dict(embed_scale=math.sqrt(cfg.n_embd), act="gelu", post_norms=True, attn_scale=1.0, prescale_q=False,
                attn_softcap=0.0, final_softcap=cfg.final_logit_softcap,
                windows=[cfg.sliding_window if s else 0 for s in swa],
                rope_bases=[cfg.rope_freq_base_swa if s else cfg.rope_freq_base for s in swa], v_norm=True)


def store_head_dim(cfg) -> int:
    """The KV store's head size: the largest of the two."""
    return max(cfg.head_dim, cfg.head_dim_swa)


def layer_rope(cfg, il: int, device) -> tuple[torch.Tensor, float]:
    """(inv_freq [n_rot_l / 2] float32, ggml theta_scale or 0) of layer il: sliding layers the plain
    chain of their base over n_rot_swa dims; full layers the file's base over n_rot dims divided by
    `rope_freqs` (then no chain: angles from inv_freq)."""
    if cfg.swa_layers[il]:
        local = SimpleNamespace(head_dim=cfg.head_dim_swa, n_rot=cfg.n_rot_swa, rope_freq_base=cfg.rope_freq_base_swa)
        return rope_inv_freq(local).to(device), rope_theta_scale(local)
    return rope_inv_freq(cfg).to(device), rope_theta_scale(cfg)


def check_source(cfg) -> None:
    for il in range(cfg.n_layer_kv, cfg.n_layer):
        src = kv_source(cfg, il)
        if cfg.swa_layers[src] != cfg.swa_layers[il]:
            raise ValueError(f"{cfg.arch}: KV-shared layer {il} ({'sliding' if cfg.swa_layers[il] else 'full'}) "
                             f"would read layer {src} of the other kind")


def attention_weights(fused, q, w: dict, p: str, cfg, il: int) -> dict[str, Any]:
    """Layer il's attention matrices and facts for the decoder's `Layer`."""
    if p + "attn_qkv.weight" in w:
        raise ValueError(f"{cfg.arch}: fused attn_qkv tensors are not supported by tritium")
    src = kv_source(cfg, il)
    names = [p + "attn_q.weight"]
    v_from_k = False
    if src == il:
        names.append(p + "attn_k.weight")
        v_from_k = p + "attn_v.weight" not in w
        if not v_from_k:
            names.append(p + "attn_v.weight")
    D = cfg.head_dim_swa if cfg.swa_layers[il] else cfg.head_dim
    return dict(wqkv=fused(names), wo=q(p + "attn_output.weight"), kv_src=src, head_dim=D, v_from_k=v_from_k)


def layer_fields(cfg, w: dict, p: str, il: int, device, fused, q, prep, t) -> dict[str, Any]:
    """Layer il's fields of the decoder's `Layer` that are gemma4's own: its attention matrices and
    head size, KV source, RoPE, per-layer input and output scale."""
    out = attention_weights(fused, q, w, p, cfg, il)
    out["inv_freq"], out["rope_theta_scale"] = layer_rope(cfg, il, device)
    out["ple"], out["out_scale"] = layer_input(w, p, prep, t), out_scale(w, p)
    return out


def attention(m, li: int, L, qkv: torch.Tensor, kv, pos_t, slot_t, tables, cu, kv_lens_t, max_q_len,
              swa_slot_t, swa_tables) -> torch.Tensor:
    """Layer li's attention block of the decoder `m` (`runtime.model.decoder.Model`) from the
    projections qkv [T, H D (+ 2 KVH D)] -> [T, C]: q/k norms, v's weightless norm, the layer's RoPE,
    K/V written unless the layer reads another layer's, heads zero-padded to the store's size,
    scale 1. No LoRA."""
    T = qkv.shape[0]
    H, KVH, D, DS = m.n_head, m.n_head_kv, L.head_dim or m.head_dim, m.head_dim
    ops = m.ops
    src = L.kv_src if L.kv_src >= 0 else li
    q = qkv[:, :H * D].reshape(T, H, D)
    q = ops.rms_norm(q.reshape(T * H, D).contiguous(), L.q_norm, m.eps).view(T, H, D)
    q = ops.rope(q, pos_t, L.inv_freq, m.neox, L.rope_theta_scale, L.rope_mscale)
    own = swa_tables is not None and kv.is_swa[src]
    if src == li:
        k = qkv[:, H * D:(H + KVH) * D]
        v = k if L.v_from_k else qkv[:, (H + KVH) * D:(H + 2 * KVH) * D]
        k = ops.rms_norm(k.reshape(T * KVH, D).contiguous(), L.k_norm, m.eps).view(T, KVH, D)
        ones = torch.ones(D, dtype=torch.float32, device=v.device)
        v = ops.rms_norm(v.reshape(T * KVH, D).contiguous(), ones, m.eps).view(T, KVH, D)
        k = ops.rope(k, pos_t, L.inv_freq, m.neox, L.rope_theta_scale, L.rope_mscale)
        ops.write_kv(pad_heads(k, DS), pad_heads(v, DS), kv.k[li], kv.v[li], swa_slot_t if own else slot_t)
    attn = ops.paged_attention(pad_heads(q, DS).contiguous(), kv.k[src], kv.v[src],
                               swa_tables if own else tables, cu, kv_lens_t, 1.0, 0.0,
                               max_q_len=max_q_len, window=L.window)
    attn = attn[:, :, :D].reshape(T, H * D)
    return ops.qmatmul(attn.contiguous(), L.wo)


@dataclass
class LayerInput:
    """One layer's use of its per-layer input: h + post_norm(proj(gelu(inp_gate h) * input))."""
    inp_gate: QWeight  # [P, C]
    proj: QWeight  # [C, P]
    post_norm: torch.Tensor  # [C]

    def __call__(self, ops: kernels.Backend, h: torch.Tensor, inp: torch.Tensor, eps: float) -> torch.Tensor:
        """h [T, C] (the layer's output so far), inp [T, P] -> [T, C]."""
        g = ops.gelu_mul(ops.qmatmul(h, self.inp_gate), inp.to(h.dtype))
        return h + ops.rms_norm(ops.qmatmul(g, self.proj), self.post_norm, eps)


def layer_input(w: dict, p: str, prep, t) -> LayerInput | None:
    if p + "inp_gate.weight" not in w:
        return None
    return LayerInput(prep(w[p + "inp_gate.weight"]), prep(w[p + "proj.weight"]), t(p + "post_norm.weight"))


def out_scale(w: dict, p: str) -> float:
    s = w.get(p + "layer_output_scale.weight")
    return 1.0 if s is None else float(s.reshape(-1)[0])


@dataclass
class PerLayerEmbedding:
    """The per-layer inputs of a step (llama.cpp's build_inp_per_layer + project_per_layer_inputs)."""
    tok: QWeight  # per_layer_token_embd [n_vocab, L P]
    model_proj: QWeight  # per_layer_model_proj [L P, C]
    proj_norm: torch.Tensor  # [P]
    n_layer: int
    n_embd: int
    n_per_layer: int
    eps: float

    @classmethod
    def load(cls, cfg, w: dict, device, prep) -> "PerLayerEmbedding | None":
        if not cfg.n_embd_per_layer:
            return None
        return cls(w["per_layer_token_embd.weight"].to(device), prep(w["per_layer_model_proj.weight"]),
                   w["per_layer_proj_norm.weight"].to(device).float(), cfg.n_layer, cfg.n_embd,
                   cfg.n_embd_per_layer, float(cfg.rms_eps))

    def __call__(self, ops: kernels.Backend, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """ids [T], h [T, C] (the scaled token embeddings) -> [T, L, P] float32."""
        T, L, P = ids.shape[0], self.n_layer, self.n_per_layer
        f32 = np.float32
        sel = ops.embedding(ids, self.tok).float() * float(np.sqrt(f32(P), dtype=f32))
        proj = ops.qmatmul(h.float(), self.model_proj).float() * float(f32(1.0) / np.sqrt(f32(self.n_embd), dtype=f32))
        proj = ops.rms_norm(proj.reshape(T * L, P).contiguous(), self.proj_norm, self.eps).reshape(T, L, P)
        return (proj + sel.reshape(T, L, P)) * float(f32(1.0) / np.sqrt(f32(2.0), dtype=f32))


def pad_heads(x: torch.Tensor, D: int) -> torch.Tensor:
    """x [T, NH, d] zero-padded to [T, NH, D]."""
    d = x.shape[-1]
    return x if d == D else torch.nn.functional.pad(x, (0, D - d))

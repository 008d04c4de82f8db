"""qwen35 / qwen35moe (Qwen3.5, Qwen3.6) as llama.cpp b1-0c1e570 computes them (src/models/qwen35.cpp,
qwen35moe.cpp, delta-net-base.cpp; ggml's ssm_conv and gated_delta_net).

Hybrid layers: layer il is a gated linear-attention layer (a gated delta net with a short
convolution, `LinearAttention`) when `attention.recurrent_layers[il]`, or, without that array, when
(il + 1) % full_attention_interval != 0 (default interval 4); the others are full-attention layers.
Every layer: h += mixer(rms_norm(h, attn_norm)); h += ffn(rms_norm(h, post_attention_norm)) (the
loader names that norm `ffn_norm`, so the decoder's loop is the usual pre-norm one).

- full attention: `attn_q` gives per head D query rows then D gate rows; q and k RMSNormed per
  head, IMROPE (M-RoPE, interleaved sections; a text token's four positions are equal, so it is the
  plain NEOX rope of its position) over the first `rope.dimension_count` dims of each head (a
  quarter of them in the released models), scale 1/sqrt(D); the attention output times
  sigmoid(gate) before `attn_output`.
- linear attention (`LinearAttention`): from the normed input x, `attn_qkv` -> the convolution's
  input (q, k, v channels), `attn_gate` -> z, `ssm_beta` -> beta = sigmoid(.), `ssm_alpha` ->
  g = softplus(. + ssm_dt.bias) * ssm_a (ssm_a = -exp(A_log)); the channels through the short
  causal depthwise convolution (`ssm_conv1d`, K taps, its last K - 1 inputs kept per sequence) and
  SiLU; q and k L2-normalized per head (rms_norm with eps / S, times 1/sqrt(S)); the gated delta
  rule (value head h reads key head h % Hk; state per head [S, S] kept per sequence); its output
  RMSNormed per head (`ssm_norm`) times silu(z), then `ssm_out`.
- FFN: SwiGLU (qwen35); qwen35moe: softmax-routed experts (norm_w, no scale, as qwen3moe) plus a
  shared SwiGLU expert times sigmoid(x . ffn_gate_inp_shexp).
- not computed: the MTP (next-token prediction) block some files carry after the decoder layers
  (`nextn_predict_layers`): llama-server runs it only for speculative decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

import kernels
from kernels.qweight import QWeight
from runtime.model.arch.qwen3moe import MoeFFN
from runtime.model.recurrent import RecurrentShape

ARCHS = ("qwen35", "qwen35moe")


def _key(md: dict[str, Any], arch: str, key: str) -> Any:
    v = md.get(f"{arch}.{key}")
    if v is None:
        raise ValueError(f"key not found in model: {arch}.{key}")
    return v


def configure(md: dict[str, Any], cfg) -> None:
    a = cfg.arch
    cfg.ssm_conv = int(_key(md, a, "ssm.conv_kernel"))
    cfg.ssm_state = int(_key(md, a, "ssm.state_size"))
    cfg.ssm_groups = int(_key(md, a, "ssm.group_count"))
    cfg.ssm_dt_rank = int(_key(md, a, "ssm.time_step_rank"))
    cfg.ssm_inner = int(_key(md, a, "ssm.inner_size"))
    if cfg.ssm_groups <= 0 or cfg.ssm_dt_rank % cfg.ssm_groups or cfg.ssm_inner != cfg.ssm_state * cfg.ssm_dt_rank:
        raise ValueError(f"{a}: linear attention of {cfg.ssm_groups} key heads, {cfg.ssm_dt_rank} value heads, "
                         f"state {cfg.ssm_state} and inner size {cfg.ssm_inner} is not a gated delta net "
                         "(value heads a multiple of the key heads, inner size = state * value heads)")
    if cfg.ssm_conv < 1:
        raise ValueError(f"{a}: ssm.conv_kernel must be >= 1")
    explicit = md.get(f"{a}.attention.recurrent_layers")
    if isinstance(explicit, list):
        cfg.recurrent_layers = [bool(x) for x in explicit[:cfg.n_layer]]
    else:
        interval = int(md.get(f"{a}.full_attention_interval", 4) or 4)
        cfg.recurrent_layers = [(il + 1) % interval != 0 for il in range(cfg.n_layer)]
    secs = md.get(f"{a}.rope.dimension_sections")
    if secs is None:
        raise ValueError(f"key not found in model: {a}.rope.dimension_sections")
    cfg.rope_sections = [int(s) for s in list(secs)[:4]] + [0] * max(0, 4 - len(secs))
    cfg.rope_imrope = True
    if a == "qwen35moe":
        from runtime.model.arch import qwen3moe

        qwen3moe.configure(md, cfg)
        cfg.n_ff_shexp = int(md.get(f"{a}.expert_shared_feed_forward_length", 0) or 0) or cfg.n_ff


def spec_fields(cfg) -> dict[str, Any]:
    return dict(moe=cfg.arch == "qwen35moe", q_gate=True)


def split_weights(cfg, weights: dict[str, Any]) -> None:
    """`post_attention_norm` is the FFN's input norm here: named `ffn_norm` for the decoder."""
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        if p + "post_attention_norm.weight" in weights:
            weights[p + "ffn_norm.weight"] = weights.pop(p + "post_attention_norm.weight")
    extra = [n for n in weights if n.startswith(f"blk.{cfg.n_layer}.")]
    for n in extra:  # the MTP block (speculative decoding only): not loaded
        weights.pop(n)


def recurrent_shape(cfg) -> RecurrentShape:
    conv_ch = 2 * cfg.ssm_groups * cfg.ssm_state + cfg.ssm_inner
    return RecurrentShape(sum(cfg.recurrent_layers), cfg.ssm_conv - 1, conv_ch, cfg.ssm_dt_rank, cfg.ssm_state)


def _f32(x: float) -> float:
    return float(np.float32(x))


@dataclass
class LinearAttention:
    """One gated delta net layer, its weights as the model's backend prepared them."""
    w_in: list[QWeight]  # attn_qkv, attn_gate, ssm_beta, ssm_alpha (prepared together: they read x)
    conv_w: torch.Tensor  # [conv_ch, K] float32
    dt_bias: torch.Tensor  # [Hv]
    a: torch.Tensor  # [Hv] (-exp(A_log))
    norm_w: torch.Tensor  # [S]
    w_out: QWeight  # [C, Hv S]
    n_k_heads: int
    n_v_heads: int
    state_size: int
    eps: float  # the model's RMSNorm epsilon
    index: int  # this layer's row in the RecurrentStore

    @classmethod
    def load(cls, ops: kernels.Backend, w: dict, prefix: str, cfg, index: int, device, unpack: bool,
             pack: bool) -> "LinearAttention":
        S, Hk, Hv = cfg.ssm_state, cfg.ssm_groups, cfg.ssm_dt_rank
        conv_ch = 2 * Hk * S + Hv * S
        names = [prefix + n for n in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight")]
        mats = [w[n].to(device) for n in names]
        want = [(conv_ch, cfg.n_embd), (Hv * S, cfg.n_embd), (Hv, cfg.n_embd), (Hv, cfg.n_embd)]
        for n, m, (r, c) in zip(names, mats, want):
            if (m.rows, m.cols) != (r, c):
                raise ValueError(f"{n}: shape {(m.rows, m.cols)}, expected {(r, c)}")
        conv = w[prefix + "ssm_conv1d.weight"]
        conv_w = conv.to(device) if isinstance(conv, torch.Tensor) else kernels.dequantize(conv.to(device))
        if tuple(conv_w.shape) != (conv_ch, cfg.ssm_conv):
            raise ValueError(f"{prefix}ssm_conv1d.weight: shape {tuple(conv_w.shape)}, expected {(conv_ch, cfg.ssm_conv)}")
        out = w[prefix + "ssm_out.weight"].to(device)
        return cls(ops.prepare_weights(mats, unpack, pack), conv_w.float().contiguous(),
                   w[prefix + "ssm_dt.bias"].to(device).float(), w[prefix + "ssm_a"].to(device).float(),
                   w[prefix + "ssm_norm.weight"].to(device).float(), ops.prepare_weight(out, unpack, pack),
                   Hk, Hv, S, float(cfg.rms_eps), index)

    def __call__(self, ops: kernels.Backend, x: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor,
                 cells: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        """x [T, C] (the normed layer input) -> [T, C] in x.dtype; conv_state / ssm_state: this
        layer's cells (`RecurrentStore.conv[l]`, `.ssm[l]`), read and written for `cells` [S]."""
        T = x.shape[0]
        S, Hk, Hv = self.state_size, self.n_k_heads, self.n_v_heads
        key_dim, value_dim = Hk * S, Hv * S
        proj = torch.cat([ops.qmatmul(x, m) for m in self.w_in], 1) if len(self.w_in) > 1 else ops.qmatmul(x, self.w_in[0])
        proj = proj.float()
        qkv, z, b, a = proj.split([2 * key_dim + value_dim, value_dim, Hv, Hv], 1)
        beta, g = ops.gdn_gates(b, a, self.dt_bias, self.a)  # sigmoid(b), softplus(a + dt_bias) * A
        conv = ops.ssm_conv(qkv.contiguous(), self.conv_w, conv_state, cells, cu)  # [T, conv_ch], SiLU applied
        ones = torch.ones(S, dtype=torch.float32, device=x.device)
        eps_l2, inv = _f32(np.float32(self.eps) / np.float32(S)), _f32(np.float32(1.0) / np.sqrt(np.float32(S)))
        q = ops.rms_norm(conv[:, :key_dim].reshape(T * Hk, S), ones, eps_l2) * inv
        k = ops.rms_norm(conv[:, key_dim:2 * key_dim].reshape(T * Hk, S), ones, eps_l2) * inv
        v = conv[:, 2 * key_dim:].reshape(T, Hv, S)
        o = ops.gated_delta_net(q.view(T, Hk, S), k.view(T, Hk, S), v.contiguous(), g, beta, ssm_state,
                                cells, cu)  # [T, Hv, S]
        o = ops.rms_norm(o.reshape(T * Hv, S), self.norm_w, self.eps)
        o = ops.silu_mul(z.reshape(T * Hv, S).contiguous(), o).reshape(T, value_dim)
        return ops.qmatmul(o.to(x.dtype), self.w_out)


@dataclass
class SharedExpertMoE:
    """qwen35moe's FFN: routed experts (`MoeFFN`) plus a shared SwiGLU expert gated by
    sigmoid(x . ffn_gate_inp_shexp)."""
    routed: MoeFFN
    shared_gate_up: list[QWeight]
    shared_down: QWeight
    shared_gate_inp: QWeight  # [1, C] float32 (a 1-D tensor in the file: llama.cpp's mul_mat of it)
    n_ff: int

    @classmethod
    def load(cls, ops: kernels.Backend, w: dict, prefix: str, cfg, device, unpack: bool, pack: bool) -> "SharedExpertMoE":
        routed = MoeFFN.load(ops, w, prefix, cfg, device, unpack, pack)
        gu = ops.prepare_weights([w[prefix + "ffn_gate_shexp.weight"].to(device), w[prefix + "ffn_up_shexp.weight"].to(device)],
                                 unpack, pack)
        down = ops.prepare_weight(w[prefix + "ffn_down_shexp.weight"].to(device), unpack, pack)
        gate = w[prefix + "ffn_gate_inp_shexp.weight"]
        gate = gate.to(device).float() if isinstance(gate, torch.Tensor) else kernels.dequantize(gate.to(device))[0]
        gate = QWeight(gate.reshape(1, -1).contiguous(), GGMLQuantizationType.F32, 1, gate.numel())
        return cls(routed, gu, down, ops.prepare_weight(gate, unpack, pack), cfg.n_ff_shexp)

    def __call__(self, ops: kernels.Backend, x: torch.Tensor) -> torch.Tensor:
        routed = self.routed(ops, x)
        gu = torch.cat([ops.qmatmul(x, m) for m in self.shared_gate_up], 1) if len(self.shared_gate_up) > 1 \
            else ops.qmatmul(x, self.shared_gate_up[0])
        gate, up = gu.split([self.n_ff, self.n_ff], 1)
        shared = ops.qmatmul(ops.silu_mul(gate, up), self.shared_down)
        s = ops.sigmoid(ops.qmatmul(x.float(), self.shared_gate_inp))  # [T, 1]
        return routed + (shared.float() * s).to(routed.dtype)

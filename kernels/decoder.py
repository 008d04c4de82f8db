"""What a backend's fused decode loop is built from (`kernels.fused_decoder`): one layer's tensors and
the stack's shape, as plain data. Only the CPU backend has such a loop (kernels/cpu/decoder.py); the
others answer None and the runtime runs its per-op path."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .qweight import QWeight


@dataclass(frozen=True)
class DecoderLayer:
    """One layer's tensors (float32 vectors; matmul weights as `prepare_weights` returned them)."""
    attn_norm: torch.Tensor  # [C]
    wqkv: QWeight  # one x8 group: [(H + 2 KVH) D, C]
    bqkv: torch.Tensor | None  # [(H + 2 KVH) D]
    q_norm: torch.Tensor | None  # [D]
    k_norm: torch.Tensor | None  # [D]
    inv_freq: torch.Tensor  # [R]
    wo: QWeight  # [C, H D]
    ffn_norm: torch.Tensor  # [C]
    w_gate_up: QWeight  # one x8 group: [2F, C]
    w_down: QWeight  # [C, F]
    post_attn_norm: torch.Tensor | None = None  # [C] (gemma2/3: RMSNorm of the attention block's output)
    post_ffn_norm: torch.Tensor | None = None  # [C] (of the FFN's output)
    window: int = 0  # sliding window of the layer's attention (0: global)
    rope_theta_scale: float = 0.0  # ggml's RoPE angle chain (kernels.ref.rope_angles), 0: from inv_freq
    rope_mscale: float = 1.0  # cos and sin times it (`kernels.rope`'s mscale: YaRN's magnitude)


@dataclass(frozen=True)
class DecoderShape:
    n_head: int
    n_head_kv: int
    head_dim: int
    n_embd: int
    n_ff: int
    eps: float
    neox: bool
    scale: float
    act: str = "silu"  # the FFN's gate: "silu" (SwiGLU) or "gelu" (GeGLU with ggml's float16-table GELU)
    softcap: float = 0.0  # tanh soft-cap of the attention scores (0: none)
    prescale_q: bool = False  # q *= scale before the attention, which then scales by 1 (llama.cpp's gemma)

"""What distinguishes one decoder architecture from another in the forward, as plain data.

`runtime.model.decoder.Model` runs one decoder loop for every supported architecture; an `ArchSpec`
says what varies: the embedding scale, the FFN activation, the extra norms, the attention scale
and soft-caps, and per layer the sliding window and the RoPE base. The architecture modules
(`runtime/model/arch/gemma.py`, `runtime/model/arch/qwen3moe.py`, `runtime/model/arch/phi3.py`,
`runtime/model/arch/qwenvl.py`: M-RoPE and deepstack inputs, `runtime/model/arch/qwen35.py`: hybrid
gated linear-attention / full-attention layers, `runtime/model/arch/smollm3.py`: llama with NoPE layers,
`runtime/model/arch/mistral3.py`: llama with attention temperature tuning, `runtime/model/arch/gemma4.py`:
per-layer embeddings, KV shared across layers, per-layer head sizes, `runtime/model/arch/gptoss.py`:
attention sinks and biases, alternating sliding windows, biased MXFP4 experts) read their GGUF keys
into `ModelConfig` (`configure`) and derive the spec (`spec_for`); llama / mistral / qwen2 / qwen3 /
phi3 use the default spec. `moe`: the FFN of every layer is a mixture of experts
(`qwen3moe.MoeFFN`). `split_weights`: the loader's hook that turns an architecture's fused tensors
(phi3's `attn_qkv`, gate+up `ffn_up`) into the separate names the forward reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import gemma, gemma4, gptoss, mistral3, phi3, qwen35, qwen3moe, qwenvl, smollm3

# arch -> NEOX rope (half-split pairs) or the "normal" pairwise rope (GGUF llama weights are
# permuted for it); the loader accepts exactly these
ROPE_NEOX = {"llama": False, "mistral": False, "qwen2": True, "qwen3": True,
             **{a: True for a in gemma.ARCHS}, **{a: True for a in gemma4.ARCHS}, **{a: True for a in qwen3moe.ARCHS}, **{a: True for a in phi3.ARCHS},
             **{a: True for a in qwenvl.ARCHS}, **{a: True for a in qwen35.ARCHS},
             **{a: False for a in smollm3.ARCHS}, **{a: False for a in mistral3.ARCHS},
             **{a: True for a in gptoss.ARCHS}}


@dataclass
class ArchSpec:
    embed_scale: float = 1.0  # token embeddings are multiplied by it (gemma: sqrt(n_embd))
    act: str = "silu"  # FFN: "silu" (SwiGLU) | "gelu" (GeGLU, tanh GELU)
    post_norms: bool = False  # gemma2/3: RMSNorm of the attention and FFN outputs before the residual add
    attn_scale: float | None = None  # scale of q.k (None: 1/sqrt(head_dim) times YaRN's factor)
    prescale_q: bool = False  # q is multiplied by attn_scale before attention, which then scales by 1
    # (llama.cpp's gemma graphs: ggml_scale(Qcur) and kq_scale 1; its flash attention rounds q to float16
    # after the scale, which differs from scaling the scores where q's small elements are float16 subnormals)
    attn_softcap: float = 0.0  # tanh soft-cap of the attention scores (gemma2)
    final_softcap: float = 0.0  # tanh soft-cap of the output logits (gemma2)
    windows: list[int] = field(default_factory=list)  # per layer: sliding window (0: global attention)
    rope_bases: list[float] = field(default_factory=list)  # per layer: RoPE base (empty: cfg.rope_freq_base)
    moe: bool = False  # mixture-of-experts FFN in every layer (runtime/model/arch/qwen3moe.py)
    q_gate: bool = False  # attn_q gives per head D query rows then D gate rows: output * sigmoid(gate) (qwen35)
    nope: list[bool] = field(default_factory=list)  # per layer: no RoPE on q and k (smollm3's every 4th layer)
    v_norm: bool = False  # v RMSNormed per head without a weight; per-layer head sizes, shared KV (gemma4)

    def window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0


def configure(md: dict[str, Any], cfg) -> None:
    """Fill the architecture's own ModelConfig fields from GGUF metadata (the loader calls it)."""
    if cfg.arch in gemma.ARCHS:
        gemma.configure(md, cfg)
    elif cfg.arch in gemma4.ARCHS:
        gemma4.configure(md, cfg)
    elif cfg.arch in qwen3moe.ARCHS:
        qwen3moe.configure(md, cfg)
    elif cfg.arch in phi3.ARCHS:
        phi3.configure(md, cfg)
    elif cfg.arch in qwenvl.ARCHS:
        qwenvl.configure(md, cfg)
    elif cfg.arch in qwen35.ARCHS:
        qwen35.configure(md, cfg)
    elif cfg.arch in mistral3.ARCHS:
        mistral3.configure(md, cfg)
    elif cfg.arch in gptoss.ARCHS:
        gptoss.configure(md, cfg)


def split_weights(cfg, weights: dict[str, Any]) -> None:
    """Split the architecture's fused tensors in place (the loader calls it once the weights are read)."""
    if cfg.arch in phi3.ARCHS:
        phi3.split_weights(cfg, weights)
    elif cfg.arch in qwen35.ARCHS:
        qwen35.split_weights(cfg, weights)
    elif cfg.arch in gptoss.ARCHS:
        gptoss.split_weights(cfg, weights)


def moe_class(cfg):
    """The class of a mixture-of-experts model's FFN layers (`load(ops, w, prefix, cfg, device, unpack, pack)`)."""
    if cfg.arch in gptoss.ARCHS:
        return gptoss.GptOssMoE
    return qwen35.SharedExpertMoE if cfg.n_ff_shexp else qwen3moe.MoeFFN


def spec_for(cfg) -> ArchSpec:
    if cfg.arch in gemma.ARCHS:
        return ArchSpec(**gemma.spec_fields(cfg))
    if cfg.arch in gemma4.ARCHS:
        return ArchSpec(**gemma4.spec_fields(cfg))
    if cfg.arch in qwen3moe.ARCHS:
        return ArchSpec(**qwen3moe.spec_fields(cfg))
    if cfg.arch in qwen35.ARCHS:
        return ArchSpec(**qwen35.spec_fields(cfg))
    if cfg.arch in smollm3.ARCHS:
        return ArchSpec(**smollm3.spec_fields(cfg))
    if cfg.arch in gptoss.ARCHS:
        return ArchSpec(**gptoss.spec_fields(cfg))
    return ArchSpec()


__all__ = ["ArchSpec", "ROPE_NEOX", "configure", "moe_class", "spec_for", "split_weights"]

"""Random-weight GGUF models for tests, benchmarks and the server's default model.

- `TinyModelSpec`: the shape (defaults: the lesson's model: llama, 4 layers, 256 dims, 8 heads,
  2 KV heads, FFN 704, context 4096) plus weight type and seed. `qwen3moe`: qwen3 attention and a
  mixture-of-experts FFN (`n_expert` experts of `n_ff_exp` rows, `n_expert_used` per token; router
  `ffn_gate_inp` kept in F32 as llama.cpp's quantizer keeps it; experts as 3-D `ffn_*_exps`).
  `MOE_SPEC` is the tests' tiny one. `phi3`: fused `attn_qkv` (q, k, v rows stacked) and `ffn_up`
  holding gate and up ([2 n_ff, n_embd]), no `ffn_gate`; `sliding_window` > 0 writes
  `phi3.attention.sliding_window` (which llama.cpp b1-0c1e570 ignores for phi3). `PHI3_SPEC` is the
  tests' tiny one. `gemma3`: q/k RMSNorms (`attn_q_norm`, `attn_k_norm`), post-attention and
  post-FFN RMSNorms (`post_attention_norm`, `post_ffw_norm`), `key_length` / `value_length` always
  written; `sliding_window` > 0 makes every layer but each sixth local (llama.cpp's default pattern
  of 6), `rope_freq_base_swa` > 0 is written as `gemma3.rope.freq_base_swa` (otherwise llama.cpp's
  default 10000). `GEMMA3_SPEC` is the tests' tiny one (6 layers: 5 local, 1 global).
- `norm_std` > 0: norm weights 1 + N(0, norm_std) instead of ones (gemma's GGUF norms hold 1 + w).
- `write_tiny_model(path, spec, vocab=None | path to a vocab-only GGUF | "builtin")` writes the
  file with `gguf.GGUFWriter`. With `/work/shared/vocab/ggml-vocab-qwen2.gguf` and `--type f32`
  it has exactly the lesson's 80,611,584 parameters and 322,446,336 bytes of tensor data.
- `vocab="builtin"`: `runtime.tokenizer.builtin_vocab.builtin_vocab()`, a small byte-level BPE vocabulary
  (ChatML special tokens, `qwen2` pre-tokenizer).
- `ensure_default_model() -> Path`: the built-in model, generated once into
  `$TRITIUM_CACHE` (default `~/.cache/tritium/`).
- `quantize(x: float32 [rows, cols], qtype) -> uint8 [rows, row_bytes]`: gguf's quantizers plus
  simple Q4_K / Q6_K ones (gguf-py has none for k-quants).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf import quants as gquants

from runtime.tokenizer.builtin_vocab import builtin_vocab
from runtime.model import tiny_arch, tiny_gemma4
from runtime.model.gguf import KV, read_gguf

__all__ = [
    "TinyModelSpec", "write_tiny_model", "vocab_from_gguf", "ensure_default_model", "quantize",
    "BUILTIN_SPEC", "MOE_SPEC", "PHI3_SPEC", "GEMMA3_SPEC", "RERANK_SPEC", "QWEN35_SPEC", "QWEN35MOE_SPEC", "SMOLLM3_SPEC", "MISTRAL3_SPEC", "GEMMA4_SPEC", "GPTOSS_SPEC",
    "WEIGHT_TYPES", "ARCHS",
]

Q = GGMLQuantizationType


@dataclass(frozen=True)
class TinyModelSpec:
    arch: str = "llama"  # one of ARCHS
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 8
    n_head_kv: int = 2
    n_ff: int = 704
    n_ctx: int = 4096
    head_dim: int | None = None  # None: n_embd // n_head
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    wtype: str = "f32"  # one of WEIGHT_TYPES
    seed: int = 0
    init_std: float = 0.02
    name: str = "tiny-random"
    n_vocab: int = 0  # only used without a vocabulary (0: 256)
    tie_embeddings: bool = False  # True: no output.weight (the output reuses token_embd)
    random_blocks: bool = False  # quantized tensors as random GGUF blocks (fast for 8B shapes)
    n_expert: int = 8  # qwen3moe: experts per layer
    n_expert_used: int = 2  # qwen3moe: experts per token
    n_ff_exp: int = 64  # qwen3moe: rows of each expert's gate / up (cols of its down)
    router_std: float = 0.0  # qwen3moe: std of the router weights (0: init_std)
    sliding_window: int = 0  # phi3 / gemma3: written as attention.sliding_window when > 0
    rope_freq_base_swa: float = 0.0  # gemma3: rope.freq_base_swa when > 0 (local layers' RoPE base)
    norm_std: float = 0.0  # > 0: norm weights 1 + N(0, norm_std) (0: ones)
    rope_sections: tuple[int, ...] = ()  # qwen2vl / qwen3vl: rope.dimension_sections (M-RoPE, 4 entries)
    n_deepstack: int = 0  # qwen3vl: n_deepstack_layers (vision features added after the first layers)
    rerank: bool = False  # qwen3: a Qwen3-Reranker's layout (RANK pooling, cls.output yes/no head, rerank template)
    # qwen35 / qwen35moe (runtime/model/tiny_arch.py): the gated linear-attention layers' sizes
    ssm_conv: int = 4  # ssm.conv_kernel: taps of the short convolution
    ssm_state: int = 32  # ssm.state_size: head size of k and v (S)
    ssm_groups: int = 2  # ssm.group_count: key heads
    ssm_dt_rank: int = 4  # ssm.time_step_rank: value heads (a multiple of the key heads)
    full_attn_interval: int = 2  # full_attention_interval: layer il is full attention when (il + 1) % it == 0
    n_rot: int = 0  # rope.dimension_count of qwen35 (0: head_dim / 4)
    n_ff_shexp: int = 0  # qwen35moe: the shared expert's FFN length (0: n_ff)
    # mistral3: attention.temperature_scale, rope.scaling.original_context_length, YaRN (factor, log multiplier)
    attn_temp_scale: float = 0.0
    rope_orig_ctx: int = 0
    yarn_factor: float = 0.0
    yarn_log_mul: float = 0.0
    # gemma4 (runtime/model/tiny_gemma4.py): per-layer input size, sliding layers' head size (0: half
    # of head_dim), layer il sliding unless (il + 1) % period == 0, KV-shared last layers, their FFN
    # twice as long, full layers' rotated share of pairs, v = k on full layers, logit soft-cap
    n_embd_per_layer: int = 0
    head_dim_swa: int = 0
    gemma4_swa_period: int = 3
    gemma4_shared_kv: int = 0
    gemma4_double_mlp: bool = False
    gemma4_rope_partial: float = 0.25
    gemma4_k_eq_v: bool = False
    final_softcap: float = 0.0


BUILTIN_SPEC = TinyModelSpec(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=352,
                             name="tritium-builtin-tiny", seed=1234)
# the tests' tiny qwen3moe (2 layers, 8 experts of 64 rows, 2 used, head_dim 32); the router's
# weights are larger than the others' so that the experts' choice is clear-cut
MOE_SPEC = TinyModelSpec(arch="qwen3moe", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256,
                         n_ctx=512, head_dim=32, name="tiny-random-qwen3moe", seed=3,
                         n_expert=8, n_expert_used=2, n_ff_exp=64, router_std=0.5, init_std=0.05)
# the tests' tiny phi3 (2 layers, GQA 4/2 heads of 32, FFN 256); its sliding window of 16 is
# shorter than the tests' sequences, so that applying it (llama.cpp does not) would show. Its name
# must not contain "phi3" / "phi-3": llama.cpp then sets phi-3 token attributes and throws
# (unordered_map::at) when the vocabulary lacks "</s>", "<unk>" or "<s>", as the built-in one does
PHI3_SPEC = TinyModelSpec(arch="phi3", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256,
                          n_ctx=512, name="tiny-random-phi", seed=5, init_std=0.05, sliding_window=16)
# the tests' tiny gemma3 (6 layers: 0-4 local with a window of 8, 5 global; 4 query heads and one KV
# head of 64, so that n_head * head_dim = 256 != n_embd = 128 as in the real gemma3s; FFN 256; tied
# output). Global RoPE base 1e6, local the default 10000 (no rope.freq_base_swa key); norm weights
# around 1 as gemma's GGUF stores them (1 + w)
GEMMA3_SPEC = TinyModelSpec(arch="gemma3", n_layer=6, n_embd=128, n_head=4, n_head_kv=1, n_ff=256,
                            n_ctx=512, head_dim=64, rope_freq_base=1e6, rms_eps=1e-6,
                            name="tiny-random-gemma3", seed=7, init_std=0.02, tie_embeddings=True,
                            sliding_window=8, norm_std=0.3)
# the tests' tiny reranker, as llama.cpp's convert_hf_to_gguf.py writes a Qwen3-Reranker: qwen3,
# {arch}.pooling_type 4 (RANK), classifier.output_labels ["yes", "no"], a 2-row `cls.output.weight`
# (llama.cpp: softmax over the two, the score is the first), tokenizer.chat_template.rerank, tied output
RERANK_SPEC = TinyModelSpec(arch="qwen3", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=512,
                            head_dim=32, name="tiny-random-reranker", seed=11, init_std=0.05,
                            tie_embeddings=True, rerank=True)
# Qwen3-Reranker's template (conversion/qwen.py of llama.cpp b1-0c1e570)
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
# the tests' tiny qwen35 (4 layers: 0 and 2 gated linear attention, 1 and 3 full attention; 4 query
# heads and 2 KV heads of 64 with 16 rotated dims; linear layers with 2 key heads and 4 value heads of
# 32, a 4-tap convolution; norms around 1 as the converter's 1 + w) and qwen35moe (the same layers,
# 8 experts of 64, 2 used, a shared expert of 128)
# the tests' tiny smollm3: llama's layout, 8 layers so that two (3 and 7) are NoPE layers
SMOLLM3_SPEC = TinyModelSpec(arch="smollm3", n_layer=8, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=1024,
                             rope_freq_base=5e6, rms_eps=1e-6, name="tiny-random-smollm3", seed=21, init_std=0.05,
                             tie_embeddings=True)
# the tests' tiny mistral3: llama's layout; attention temperature tuning from position 8 on
MISTRAL3_SPEC = TinyModelSpec(arch="mistral3", n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=1024,
                              rope_freq_base=1e6, rms_eps=1e-5, name="tiny-random-mistral3", seed=23, init_std=0.05,
                              attn_temp_scale=0.5, rope_orig_ctx=8)
# the tests' tiny gemma4 (E2B-like): 9 layers, every third full (heads of 64, a quarter of the pairs
# rotated through rope_freqs, v = k), the others sliding (heads of 32, window 8); the last 3 layers
# read the KV of layers 4 (sliding) and 5 (full) and have a double-wide FFN; per-layer inputs of 32;
# 4 query heads, one KV head; tied output, logits soft-capped at 30
GEMMA4_SPEC = TinyModelSpec(arch="gemma4", n_layer=9, n_embd=128, n_head=4, n_head_kv=1, n_ff=256, n_ctx=1024,
                            head_dim=64, head_dim_swa=32, rope_freq_base=1e6, rope_freq_base_swa=1e4, rms_eps=1e-6,
                            name="tiny-random-gemma4", seed=31, init_std=0.05, tie_embeddings=True, sliding_window=8,
                            norm_std=0.3, n_embd_per_layer=32, gemma4_shared_kv=3, gemma4_double_mlp=True,
                            gemma4_k_eq_v=True, final_softcap=30.0)
QWEN35_SPEC = TinyModelSpec(arch="qwen35", n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=1024,
                            head_dim=64, rope_freq_base=1e7, rms_eps=1e-6, name="tiny-random-qwen35", seed=11,
                            init_std=0.05, norm_std=0.1)
QWEN35MOE_SPEC = replace(QWEN35_SPEC, arch="qwen35moe", name="tiny-random-qwen35moe", seed=12, n_expert=8,
                         n_expert_used=2, n_ff_exp=64, n_ff_shexp=128, router_std=0.5)
# the tests' tiny gpt-oss: 4 layers (0 and 2 with a sliding window of 8, 1 and 3 global), 4 query heads and
# 2 KV heads of 64 (n_head * head_dim = 256 != n_embd = 128, as in the real ones), 8 experts of 64 with 4
# used (the released models' k), RoPE base 150000 as theirs; weights of 0.1 and norms around 1 so that greedy
# continuations vary (at 0.05 they repeat one token)
GPTOSS_SPEC = TinyModelSpec(arch="gpt-oss", n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=1024,
                            head_dim=64, rope_freq_base=150000.0, rms_eps=1e-5, name="tiny-random-gpt-oss", seed=31,
                            init_std=0.1, norm_std=0.3, n_expert=8, n_expert_used=4, n_ff_exp=64, router_std=0.5,
                            sliding_window=8)
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma3", "qwen2vl", "qwen3vl", "smollm3", "mistral3",
         "gpt-oss", *tiny_arch.ARCHS, *tiny_gemma4.ARCHS)
_BUILTIN_VERSION = 1  # bump when the built-in vocab/spec changes (cache file name)


# ---------------------------------------------------------------------------------------------
# quantization

def _f16_bytes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N] -> (uint8 [N, 2] f16 bytes, the f16 value back as float32 [N])."""
    h = x.astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, 256] -> uint8 [N, 210] (ql[128], qh[64], int8 scales[16], f16 d)."""
    n = x.shape[0]
    xs = x.reshape(n, 16, 16)
    sub = np.abs(xs).max(-1) / 31.0  # [N, 16] per sub-block step
    d_bytes, d = _f16_bytes(sub.max(-1) / 127.0)  # [N]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.round(sub / d[:, None]), 0).clip(0, 127)
        step = d[:, None] * sc  # [N, 16]
        q = np.where(step[..., None] > 0, np.round(xs / step[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(n, 256)
    lo = (q & 0x0F).reshape(n, 2, 2, 64)
    ql = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(n, 128)
    hi = (q >> 4).reshape(n, 2, 4, 32)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(n, 64)
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh, scales, d_bytes], axis=1)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, 256] -> uint8 [N, 144] (f16 d, f16 dmin, scales[12], qs[128])."""
    n = x.shape[0]
    xs = x.reshape(n, 8, 32)
    lo = np.minimum(xs.min(-1), 0.0)  # [N, 8] (mins are subtracted, so <= 0)
    scale = (xs.max(-1) - lo) / 15.0
    mins = -lo
    d_bytes, d = _f16_bytes(scale.max(-1) / 63.0)
    m_bytes, dmin = _f16_bytes(mins.max(-1) / 63.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.round(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin[:, None] > 0, np.round(mins / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc
        off = dmin[:, None] * mn
        q = np.where(step[..., None] > 0, np.round((xs + off[..., None]) / step[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    packed = np.empty((n, 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([d_bytes, m_bytes, packed, qs], axis=1)


_OWN_QUANTIZERS = {Q.Q4_K: _quantize_q4_k, Q.Q6_K: _quantize_q6_k}


def quantize(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 [rows, cols] -> the GGUF data of `qtype`: uint8 [rows, row_bytes] for quantized
    types, float16/float32 [rows, cols] for F16/F32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    fn = _OWN_QUANTIZERS.get(qtype)
    if fn is None:
        return gquants.quantize(x, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows, cols = x.shape
    if cols % block_size:
        raise ValueError(f"{qtype.name}: row size {cols} is not a multiple of {block_size}")
    return fn(x.reshape(-1, block_size)).reshape(rows, cols // block_size * type_size)


# byte offsets of the f16 scale fields in one block, and the scale magnitude (times init_std)
# that gives dequantized weights of about init_std
_SCALE_FIELDS = {
    Q.Q8_0: ([0], 1 / 64), Q.Q4_0: ([0], 1 / 4), Q.Q4_1: ([0, 2], 1 / 8), Q.Q5_0: ([0], 1 / 8),
    Q.Q5_1: ([0, 2], 1 / 16), Q.Q2_K: ([80, 82], 1 / 16), Q.Q3_K: ([108], 1 / 64),
    Q.Q4_K: ([0, 2], 1 / 256), Q.Q5_K: ([0, 2], 1 / 512), Q.Q6_K: ([208], 1 / 1024),
}


def random_blocks(rows: int, cols: int, qtype: GGMLQuantizationType, rng: np.random.Generator,
                  std: float) -> np.ndarray:
    """Valid random GGUF blocks [rows, row_bytes] of `qtype` (random quants and sub-scales, small
    positive f16 scales): a real-shaped quantized model without quantizing billions of floats."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * (cols // block_size)
    data = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    offsets, mag = _SCALE_FIELDS[qtype]
    for off in offsets:
        d = (rng.random(n_blocks, dtype=np.float32) * 0.5 + 0.75) * std * mag
        data[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return data.reshape(rows, cols // block_size * type_size)


# --type -> (file type, base tensor type); per-tensor choices follow llama.cpp's mixes
WEIGHT_TYPES = {
    "f32": (LlamaFileType.ALL_F32, Q.F32),
    "f16": (LlamaFileType.MOSTLY_F16, Q.F16),
    "q8_0": (LlamaFileType.MOSTLY_Q8_0, Q.Q8_0),
    "q4_0": (LlamaFileType.MOSTLY_Q4_0, Q.Q4_0),
    "q4_k": (LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K),
    "q6_k": (LlamaFileType.MOSTLY_Q6_K, Q.Q6_K),
    "mxfp4": (LlamaFileType.MOSTLY_MXFP4_MOE, Q.MXFP4),  # gpt-oss: experts MXFP4, routers F32, the rest Q8_0
}

# llama.cpp's fallback when a row is not a multiple of the k-quant super-block (256)
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0, Q.Q5_K: Q.Q5_1}


def _tensor_type(name: str, wtype: str, layer: int, n_layer: int, cols: int) -> GGMLQuantizationType:
    base = WEIGHT_TYPES[wtype][1]
    if base == Q.MXFP4:  # llama.cpp's MXFP4_MOE: experts MXFP4, the router F32, every other matrix Q8_0
        return Q.MXFP4 if name.endswith("_exps.weight") else Q.F32 if name.endswith("ffn_gate_inp.weight") else Q.Q8_0
    if base in (Q.F32, Q.F16) or tiny_arch.keeps_f32(name):
        return Q.F32 if tiny_arch.keeps_f32(name) else base
    t = base
    if name == "output.weight" and base in (Q.Q4_0, Q.Q4_K):
        t = Q.Q6_K  # llama.cpp keeps the output matrix at Q6_K for these mixes
    elif name.endswith("ffn_gate_inp.weight"):
        return Q.F32  # llama.cpp's quantizer never quantizes the router
    elif base == Q.Q4_K and name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")):
        # Q4_K_M: more bits for a subset of the layers (llama.cpp's use_more_bits)
        if layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2:
            t = Q.Q6_K
    block = GGML_QUANT_SIZES[t][0]
    if cols % block:
        t = _FALLBACK.get(t, t)
        if cols % GGML_QUANT_SIZES[t][0]:
            t = Q.F16
    return t


# ---------------------------------------------------------------------------------------------
# vocabularies

def vocab_from_gguf(path: str | Path) -> list[KV]:
    """Every `tokenizer.*` key of a GGUF file with its value type."""
    gf = read_gguf(path, with_tensors=False)
    return [(k, v, *gf.value_types[k]) for k, v in gf.metadata.items() if k.startswith("tokenizer.")]


def _encode_str(s: Any) -> Any:
    # strings read with surrogateescape (invalid UTF-8 in the source file) go back as bytes
    if isinstance(s, str):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return s.encode("utf-8", errors="surrogateescape")
    return s


# ---------------------------------------------------------------------------------------------
# writing

def _head_dim(spec: TinyModelSpec) -> int:
    return spec.head_dim or spec.n_embd // spec.n_head


def tensor_shapes(spec: TinyModelSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape [rows, cols] or [n]) of every tensor, in file order."""
    if spec.arch in tiny_arch.ARCHS:
        return tiny_arch.tensor_shapes(spec, n_vocab)
    if spec.arch in tiny_gemma4.ARCHS:
        return tiny_gemma4.tensor_shapes(spec, n_vocab)
    if spec.arch == "gpt-oss":
        return _gptoss_shapes(spec, n_vocab)
    hd = _head_dim(spec)
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, spec.n_embd))]
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (spec.n_embd,)))
        if spec.arch == "phi3":  # q, k, v stacked by rows
            out.append((p + "attn_qkv.weight", (q_dim + 2 * kv_dim, spec.n_embd)))
        else:
            out.append((p + "attn_q.weight", (q_dim, spec.n_embd)))
            out.append((p + "attn_k.weight", (kv_dim, spec.n_embd)))
            out.append((p + "attn_v.weight", (kv_dim, spec.n_embd)))
        if spec.arch in ("qwen2", "qwen2vl"):
            out += [(p + "attn_q.bias", (q_dim,)), (p + "attn_k.bias", (kv_dim,)),
                    (p + "attn_v.bias", (kv_dim,))]
        if spec.arch in ("qwen3", "qwen3moe", "gemma3", "qwen3vl"):
            out += [(p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]
        out.append((p + "attn_output.weight", (spec.n_embd, q_dim)))
        if spec.arch == "gemma3":
            out.append((p + "post_attention_norm.weight", (spec.n_embd,)))
        out.append((p + "ffn_norm.weight", (spec.n_embd,)))
        if spec.arch == "qwen3moe":  # numpy shapes [n_expert, rows, cols] (GGUF ne reversed)
            E, F = spec.n_expert, spec.n_ff_exp
            out += [(p + "ffn_gate_inp.weight", (E, spec.n_embd)), (p + "ffn_gate_exps.weight", (E, F, spec.n_embd)),
                    (p + "ffn_up_exps.weight", (E, F, spec.n_embd)), (p + "ffn_down_exps.weight", (E, spec.n_embd, F))]
            continue
        if spec.arch == "phi3":  # gate and up stacked by rows in ffn_up
            out.append((p + "ffn_up.weight", (2 * spec.n_ff, spec.n_embd)))
        else:
            out.append((p + "ffn_gate.weight", (spec.n_ff, spec.n_embd)))
            out.append((p + "ffn_up.weight", (spec.n_ff, spec.n_embd)))
        out.append((p + "ffn_down.weight", (spec.n_embd, spec.n_ff)))
        if spec.arch == "gemma3":
            out.append((p + "post_ffw_norm.weight", (spec.n_embd,)))
    out.append(("output_norm.weight", (spec.n_embd,)))
    if spec.rerank:
        out.append(("cls.output.weight", (2, spec.n_embd)))
    if not spec.tie_embeddings:
        out.append(("output.weight", (n_vocab, spec.n_embd)))
    return out


def _gptoss_shapes(spec: TinyModelSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """gpt-oss in llama.cpp's layout (src/models/openai-moe.cpp load_arch_tensors): q/k/v and output
    biases, per-head attention sinks, the FFN's input norm as `post_attention_norm`, a biased router
    and biased experts (the expert biases 2-D: [n_expert, rows])."""
    hd, C, E, F = _head_dim(spec), spec.n_embd, spec.n_expert, spec.n_ff_exp
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, C))]
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (C,)), (p + "post_attention_norm.weight", (C,)),
                (p + "attn_q.weight", (q_dim, C)), (p + "attn_k.weight", (kv_dim, C)), (p + "attn_v.weight", (kv_dim, C)),
                (p + "attn_q.bias", (q_dim,)), (p + "attn_k.bias", (kv_dim,)), (p + "attn_v.bias", (kv_dim,)),
                (p + "attn_output.weight", (C, q_dim)), (p + "attn_output.bias", (C,)),
                (p + "attn_sinks.weight", (spec.n_head,)),
                (p + "ffn_gate_inp.weight", (E, C)), (p + "ffn_gate_inp.bias", (E,)),
                (p + "ffn_gate_exps.weight", (E, F, C)), (p + "ffn_up_exps.weight", (E, F, C)),
                (p + "ffn_down_exps.weight", (E, C, F)), (p + "ffn_gate_exps.bias", (E, F)),
                (p + "ffn_up_exps.bias", (E, F)), (p + "ffn_down_exps.bias", (E, C))]
    out.append(("output_norm.weight", (C,)))
    out.append(("output.weight", (n_vocab, C)))
    return out


def write_tiny_model(path: str | Path, spec: TinyModelSpec = TinyModelSpec(),
                     vocab: str | Path | list[KV] | None = None) -> Path:
    """Write a random-weight GGUF. `vocab`: a vocab-only GGUF path (every `tokenizer.*` key is
    copied), "builtin" (see `builtin_vocab`), a list of keys, or None (no tokenizer;
    `spec.n_vocab` rows, default 256)."""
    if spec.arch not in ARCHS:
        raise ValueError(f"unsupported arch {spec.arch!r}")
    if spec.wtype not in WEIGHT_TYPES:
        raise ValueError(f"unsupported weight type {spec.wtype!r} (one of {', '.join(WEIGHT_TYPES)})")
    if spec.n_head % spec.n_head_kv:
        raise ValueError("n_head must be a multiple of n_head_kv")
    if vocab == "builtin":
        keys = builtin_vocab()
    elif isinstance(vocab, (str, Path)):
        keys = vocab_from_gguf(vocab)
    else:
        keys = list(vocab or [])
    kv = {k: v for k, v, _, _ in keys}
    n_vocab = len(kv["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in kv else (spec.n_vocab or 256)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ftype, _ = WEIGHT_TYPES[spec.wtype]
    hd = _head_dim(spec)
    w = GGUFWriter(str(path), spec.arch)
    w.add_name(spec.name)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(tiny_gemma4.ff_length(spec) if spec.arch in tiny_gemma4.ARCHS else spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_freq_base(spec.rope_freq_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_dimension_count(tiny_arch.n_rot(spec) if spec.arch in tiny_arch.ARCHS else hd)
    if spec.arch in ("qwen3moe", "gpt-oss"):
        if not 0 < spec.n_expert_used <= spec.n_expert:
            raise ValueError(f"{spec.arch} needs 0 < n_expert_used <= n_expert")
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.sliding_window > 0:
        w.add_sliding_window(spec.sliding_window)
    if spec.rope_freq_base_swa > 0:
        w.add_key_value(f"{spec.arch}.rope.freq_base_swa", float(spec.rope_freq_base_swa), GGUFValueType.FLOAT32)
    if spec.rope_sections:
        w.add_key_value(f"{spec.arch}.rope.dimension_sections", list(spec.rope_sections), GGUFValueType.ARRAY,
                        sub_type=GGUFValueType.INT32)
    if spec.n_deepstack:
        w.add_key_value(f"{spec.arch}.n_deepstack_layers", spec.n_deepstack, GGUFValueType.UINT32)
    if spec.arch in tiny_arch.ARCHS:
        tiny_arch.write_keys(w, spec)
    if spec.arch in tiny_gemma4.ARCHS:
        tiny_gemma4.write_keys(w, spec)
    if spec.attn_temp_scale:
        w.add_key_value(f"{spec.arch}.attention.temperature_scale", float(spec.attn_temp_scale), GGUFValueType.FLOAT32)
    if spec.rope_orig_ctx:
        w.add_key_value(f"{spec.arch}.rope.scaling.original_context_length", spec.rope_orig_ctx, GGUFValueType.UINT32)
    if spec.yarn_factor:
        w.add_key_value(f"{spec.arch}.rope.scaling.type", "yarn", GGUFValueType.STRING)
        w.add_key_value(f"{spec.arch}.rope.scaling.factor", float(spec.yarn_factor), GGUFValueType.FLOAT32)
    if spec.yarn_log_mul:
        w.add_key_value(f"{spec.arch}.rope.scaling.yarn_log_multiplier", float(spec.yarn_log_mul), GGUFValueType.FLOAT32)
    if spec.head_dim is not None or spec.arch in ("qwen3", "qwen3moe", "gemma3", "qwen3vl", "gemma4", "gpt-oss"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_vocab_size(n_vocab)
    if spec.rerank:
        if spec.arch != "qwen3":
            raise ValueError("rerank: only qwen3 (llama.cpp loads cls.output for qwen3 among the decoders)")
        w.add_uint32(f"{spec.arch}.pooling_type", 4)  # llama_pooling_type RANK
        w.add_array(f"{spec.arch}.classifier.output_labels", ["yes", "no"])
        w.add_string("tokenizer.chat_template.rerank", RERANK_TEMPLATE)
    w.add_file_type(int(ftype))
    if spec.wtype not in ("f32", "f16"):
        w.add_quantization_version(2)
    for key, val, vtype, itype in keys:
        if vtype == GGUFValueType.ARRAY and itype == GGUFValueType.STRING:
            val = [_encode_str(s) for s in val]
        elif vtype == GGUFValueType.STRING:
            val = _encode_str(val)
        w.add_key_value(key, val, vtype, sub_type=itype)

    rng = np.random.default_rng(spec.seed)
    for name, shape in tensor_shapes(spec, n_vocab):
        own = (tiny_gemma4.one_d if spec.arch in tiny_gemma4.ARCHS else tiny_arch.one_d)(name, shape, rng, spec) \
            if len(shape) == 1 else None
        if own is not None:
            w.add_tensor(name, own)
            continue
        if len(shape) == 1 or name.endswith(".bias"):
            if name.endswith("attn_sinks.weight"):  # gpt-oss: sink logits of the size of the scores
                arr = rng.standard_normal(shape, dtype=np.float32).astype(np.float32)
            elif name.endswith(".bias"):
                arr = (rng.standard_normal(shape, dtype=np.float32) * spec.init_std).astype(np.float32)
            elif spec.norm_std > 0:  # norm weights around 1
                arr = (1.0 + rng.standard_normal(shape, dtype=np.float32) * spec.norm_std).astype(np.float32)
            else:
                arr = np.ones(shape, dtype=np.float32)  # norm weights
            w.add_tensor(name, arr)
            continue
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        qtype = _tensor_type(name, spec.wtype, layer, spec.n_layer, shape[-1])
        rows = int(np.prod(shape[:-1]))  # 3-D expert tensors: every expert's rows stacked
        std = spec.router_std if name.endswith("ffn_gate_inp.weight") and spec.router_std else spec.init_std
        std = tiny_arch.std_of(name, spec) or std
        if spec.random_blocks and qtype in _SCALE_FIELDS:
            data = random_blocks(rows, shape[-1], qtype, rng, std)
        else:
            x = rng.standard_normal((rows, shape[-1]), dtype=np.float32)
            x *= std
            data = quantize(x, qtype)
        data = data.reshape(*shape[:-1], data.shape[-1])
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _cache_dir() -> Path:
    from runtime.model.model_files import cache_root
    return cache_root()


def ensure_default_model() -> Path:
    """Path of the built-in model (ChatML byte-level BPE vocab, 2 layers, 128 dims, f32),
    generated on first use into `$TRITIUM_CACHE` or `~/.cache/tritium/`."""
    d = _cache_dir()
    target = d / f"tritium-builtin-tiny-v{_BUILTIN_VERSION}-f32.gguf"
    if target.exists():
        return target
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-builtin-", suffix=".gguf", dir=d)
    os.close(fd)
    try:
        write_tiny_model(tmp, BUILTIN_SPEC, vocab="builtin")
        os.replace(tmp, target)  # atomic: concurrent callers see a whole file or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def spec_with(**overrides: Any) -> TinyModelSpec:
    """`TinyModelSpec()` with the non-None overrides applied."""
    return replace(TinyModelSpec(), **{k: v for k, v in overrides.items() if v is not None})

"""What a loaded model is, whatever file it came from: `ModelConfig` (the hyper-parameters the
forward needs), `LoadedModel` (config + weights + file facts), llama.cpp's file-type names.
Shared by the GGUF loader (`loader.py`) and the safetensors loader (`safetensors_loader.py`).
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from gguf import GGMLQuantizationType, LlamaFileType


@dataclass
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_freq_base: float = 10000.0
    n_rot: int = 0  # rotated dims per head (== head_dim unless partial rope)
    rope_scaling_type: str = "none"  # "none" | "linear" | "yarn"
    rope_scaling_factor: float = 1.0  # context extension factor (freq_scale = 1 / factor)
    rope_scaling_orig_ctx: int = 0  # original training context for yarn
    yarn_ext_factor: float = -1.0  # -1: llama.cpp derives it (1.0 for yarn)
    yarn_attn_factor: float = 1.0  # llama_context's yarn_attn_factor before YaRN replaces it (--yarn-attn-factor)
    rope_attn_factor: float = 1.0  # `rope.scaling.attn_factor` (llama.cpp's hparams.rope_attn_factor)
    yarn_log_mul: float = 0.0  # `rope.scaling.yarn_log_multiplier` where the architecture reads it (mistral3)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    has_rope_freqs: bool = False  # weights["rope_freqs.weight"] present (llama3 rope)
    rms_eps: float = 1e-5
    rope_neox: bool = False
    tie_embeddings: bool = False
    has_qkv_bias: bool = False
    has_qk_norm: bool = False
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    # sliding-window attention (gemma2/3, runtime/model/arch/gemma.py): window, which layers use it,
    # and the RoPE base of those layers
    sliding_window: int = 0
    swa_layers: list[bool] | None = None
    rope_freq_base_swa: float = 10000.0
    # mixture of experts (qwen3moe, runtime/model/arch/qwen3moe.py): experts per layer, per token, each
    # expert's FFN length, and how the chosen experts' weights are normalized / scaled
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0
    # M-RoPE (qwen2vl / qwen3vl, runtime/model/arch/qwenvl.py): the rotary pairs of each position
    # section (t, h, w, e), interleaved (qwen3vl) or not; deepstack layers (qwen3vl's wider inputs)
    rope_sections: list[int] | None = None
    rope_imrope: bool = False
    n_deepstack: int = 0
    # hybrid linear attention (qwen35 / qwen35moe, runtime/model/arch/qwen35.py): which layers are
    # gated delta nets, the convolution taps, the state (head) size, key heads, value heads, inner size;
    # qwen35moe's shared expert FFN length
    recurrent_layers: list[bool] | None = None
    attn_temp_scale: float = 0.0  # mistral3: Llama 4's attention temperature tuning (0: off)
    attn_temp_floor: int = 0  # mistral3: its n_ctx_orig (positions per step of the log)
    ssm_conv: int = 0
    ssm_state: int = 0
    ssm_groups: int = 0
    ssm_dt_rank: int = 0
    ssm_inner: int = 0
    n_ff_shexp: int = 0
    # gemma4 (runtime/model/arch/gemma4.py): the sliding layers' head size and rotated dims, the layers
    # with a KV cache of their own (the first n_layer_kv), FFN length per layer, per-layer input size
    head_dim_swa: int = 0
    n_rot_swa: int = 0
    n_layer_kv: int = 0
    n_ff_layers: list[int] | None = None
    n_embd_per_layer: int = 0
    # float32 [n_rot/2] divisors of the rope frequencies (llama3 rope) == weights["rope_freqs.weight"]
    rope_freq_factors: torch.Tensor | None = None


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, Any]  # name -> QWeight (matrices) | float32 torch.Tensor (1-D)
    file_type: str
    n_params: int
    size: int  # bytes of tensor data
    gguf_metadata: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    format: str = "gguf"  # "gguf" | "safetensors"
    tokenizer: Any = None  # Future of the tokenizer built beside a preload's read (runtime/launch/preload.py)


# ---------------------------------------------------------------------------------------------
# file type names (llama.cpp's llama_model_ftype_name)

_FTYPE_NAMES = {
    LlamaFileType.ALL_F32: "all F32",
    LlamaFileType.MOSTLY_F16: "F16",
    LlamaFileType.MOSTLY_BF16: "BF16",
    LlamaFileType.MOSTLY_Q4_0: "Q4_0",
    LlamaFileType.MOSTLY_Q4_1: "Q4_1",
    LlamaFileType.MOSTLY_Q5_0: "Q5_0",
    LlamaFileType.MOSTLY_Q5_1: "Q5_1",
    LlamaFileType.MOSTLY_Q8_0: "Q8_0",
    LlamaFileType.MOSTLY_MXFP4_MOE: "MXFP4 MoE",
    LlamaFileType.MOSTLY_Q2_K: "Q2_K - Medium",
    LlamaFileType.MOSTLY_Q2_K_S: "Q2_K - Small",
    LlamaFileType.MOSTLY_Q3_K_S: "Q3_K - Small",
    LlamaFileType.MOSTLY_Q3_K_M: "Q3_K - Medium",
    LlamaFileType.MOSTLY_Q3_K_L: "Q3_K - Large",
    LlamaFileType.MOSTLY_Q4_K_S: "Q4_K - Small",
    LlamaFileType.MOSTLY_Q4_K_M: "Q4_K - Medium",
    LlamaFileType.MOSTLY_Q5_K_S: "Q5_K - Small",
    LlamaFileType.MOSTLY_Q5_K_M: "Q5_K - Medium",
    LlamaFileType.MOSTLY_Q6_K: "Q6_K",
    LlamaFileType.MOSTLY_TQ1_0: "TQ1_0 - 1.69 bpw ternary",
    LlamaFileType.MOSTLY_TQ2_0: "TQ2_0 - 2.06 bpw ternary",
    LlamaFileType.MOSTLY_IQ2_XXS: "IQ2_XXS - 2.0625 bpw",
    LlamaFileType.MOSTLY_IQ2_XS: "IQ2_XS - 2.3125 bpw",
    LlamaFileType.MOSTLY_IQ2_S: "IQ2_S - 2.5 bpw",
    LlamaFileType.MOSTLY_IQ2_M: "IQ2_M - 2.7 bpw",
    LlamaFileType.MOSTLY_IQ3_XS: "IQ3_XS - 3.3 bpw",
    LlamaFileType.MOSTLY_IQ3_XXS: "IQ3_XXS - 3.0625 bpw",
    LlamaFileType.MOSTLY_IQ1_S: "IQ1_S - 1.5625 bpw",
    LlamaFileType.MOSTLY_IQ1_M: "IQ1_M - 1.75 bpw",
    LlamaFileType.MOSTLY_IQ4_NL: "IQ4_NL - 4.5 bpw",
    LlamaFileType.MOSTLY_IQ4_XS: "IQ4_XS - 4.25 bpw",
    LlamaFileType.MOSTLY_IQ3_S: "IQ3_S - 3.4375 bpw",
    LlamaFileType.MOSTLY_IQ3_M: "IQ3_S mix - 3.66 bpw",
}

# tensor type -> the file type llama.cpp guesses when general.file_type is missing
_GUESS = {
    GGMLQuantizationType.F32: LlamaFileType.ALL_F32,
    GGMLQuantizationType.F16: LlamaFileType.MOSTLY_F16,
    GGMLQuantizationType.BF16: LlamaFileType.MOSTLY_BF16,
    GGMLQuantizationType.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    GGMLQuantizationType.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    GGMLQuantizationType.Q5_0: LlamaFileType.MOSTLY_Q5_0,
    GGMLQuantizationType.Q5_1: LlamaFileType.MOSTLY_Q5_1,
    GGMLQuantizationType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    GGMLQuantizationType.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    GGMLQuantizationType.Q3_K: LlamaFileType.MOSTLY_Q3_K_M,
    GGMLQuantizationType.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    GGMLQuantizationType.Q5_K: LlamaFileType.MOSTLY_Q5_K_M,
    GGMLQuantizationType.Q6_K: LlamaFileType.MOSTLY_Q6_K,
}


def ftype_name(ftype: int) -> str:
    """llama.cpp's name of a `general.file_type` value."""
    guessed = bool(ftype & LlamaFileType.GUESSED)
    base = ftype & ~LlamaFileType.GUESSED
    try:
        name = _FTYPE_NAMES.get(LlamaFileType(base), "unknown, may not work")
    except ValueError:
        name = "unknown, may not work"
    return name + (" (guessed)" if guessed else "")


def guess_ftype(qtypes: list[GGMLQuantizationType]) -> int:
    if not qtypes:
        return LlamaFileType.ALL_F32 | LlamaFileType.GUESSED
    most = Counter(qtypes).most_common(1)[0][0]
    return int(_GUESS.get(most, LlamaFileType.ALL_F32)) | LlamaFileType.GUESSED


# ---------------------------------------------------------------------------------------------
# GGUF model loading


def print_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)

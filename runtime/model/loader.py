"""Model loading: a GGUF file (memory-mapped, zero-copy) or a Hugging Face safetensors folder
(`runtime/model/safetensors_loader.py`).

`load_model(path) -> LoadedModel`:

- `config: ModelConfig` — hyper-parameters the forward pass needs.
- `weights: dict[str, QWeight | torch.Tensor]` under GGUF tensor names (`token_embd.weight`,
  `output_norm.weight`, `output.weight` (absent when the embeddings are tied: reuse
  `token_embd.weight`), `blk.{i}.attn_norm.weight`, `blk.{i}.attn_q.weight`, `...attn_k/attn_v/
  attn_output.weight`, `blk.{i}.attn_q.bias` ... (qwen2), `blk.{i}.attn_q_norm.weight` /
  `attn_k_norm.weight` (qwen3), `blk.{i}.ffn_norm.weight`, `ffn_gate/ffn_up/ffn_down.weight`, and
  `rope_freqs.weight` ([n_rot/2] float32 divisors of the rope frequencies, llama3-style, when the
  model has one; also `config.rope_freq_factors`); qwen3moe: `blk.{i}.ffn_gate_inp.weight` (router
  [n_expert, n_embd]) and `ffn_gate_exps/ffn_up_exps/ffn_down_exps.weight`, 3-D in the file, each
  one QWeight of all experts' rows stacked ([n_expert * n_ff_exp, n_embd] / [n_expert * n_embd,
  n_ff_exp]; expert e's rows start at e * rows_per_expert); phi3's fused `attn_qkv` and gate+up
  `ffn_up` come back split into those same names (row views, `runtime/model/arch/phi3.py`).
  Matrices are `QWeight` in their file type, sharing memory with the file's copy-on-write mapping,
  which is never written (`mapped`: a backend that repacks a matrix may drop its pages from memory
  afterwards); 1-D tensors are float32.
- `file_type` (llama.cpp's ftype name, e.g. "all F32", "Q4_K - Medium"), `n_params`, `size`
  (bytes of tensor data), `gguf_metadata` (all KV metadata as plain Python values).

The GGUF file itself is read by `runtime.model.gguf` (the one GGUF reader).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from kernels.qweight import QWeight
from runtime.model import arch as archs
from runtime.model.config import LoadedModel, ModelConfig, ftype_name, guess_ftype, print_progress
from runtime.model.gguf import GGUFTensorInfo, read_gguf, tensor_data
from runtime.model.safetensors_loader import load_safetensors

__all__ = ["ModelConfig", "LoadedModel", "load_model", "ftype_name", "SUPPORTED_ARCHS"]

# arch -> rope style (runtime/model/arch): GGUF llama weights are permuted for the "normal" (pairwise)
# rope, qwen2/qwen3/gemma* use NEOX (half-split) rope.
SUPPORTED_ARCHS = archs.ROPE_NEOX


def _to_torch(arr: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    t = torch.from_numpy(arr)
    if qtype == GGMLQuantizationType.BF16:
        t = t.view(torch.bfloat16)
    return t


def _meta(md: dict[str, Any], arch: str, key: str, default: Any = None) -> Any:
    return md.get(f"{arch}.{key}", default)


def _first(v: Any) -> Any:
    """A per-layer array key's value as one number (its largest: gemma4's feed_forward_length /
    head_count_kv arrays; the architecture reads the array itself)."""
    return max(v) if isinstance(v, list) else v


def _f32(v: Any) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(v)))


def _config_from_gguf(md: dict[str, Any], names: dict[str, GGUFTensorInfo]) -> ModelConfig:
    cfg = _common_config(md, names)
    archs.configure(md, cfg)
    return cfg


def _common_config(md: dict[str, Any], names: dict[str, GGUFTensorInfo]) -> ModelConfig:
    arch = md.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported model architecture {arch!r} "
                         f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    n_embd = int(_meta(md, arch, "embedding_length"))
    n_head = int(_meta(md, arch, "attention.head_count"))
    n_head_kv = int(_first(_meta(md, arch, "attention.head_count_kv", n_head)))
    head_dim = int(_meta(md, arch, "attention.key_length", n_embd // n_head))
    n_layer = int(_meta(md, arch, "block_count"))
    emb = names.get("token_embd.weight")
    if emb is not None:
        n_vocab = emb.shape[1]
    elif f"{arch}.vocab_size" in md:
        n_vocab = int(md[f"{arch}.vocab_size"])
    else:
        n_vocab = len(md.get("tokenizer.ggml.tokens", []))
    scaling = str(_meta(md, arch, "rope.scaling.type", "none") or "none")
    factor = float(_meta(md, arch, "rope.scaling.factor", 0.0) or 0.0)
    if not factor and f"{arch}.rope.scale_linear" in md:  # older files
        factor = float(md[f"{arch}.rope.scale_linear"])
        scaling = "linear" if factor != 1.0 else scaling
    if scaling == "none":
        factor = 1.0
    return ModelConfig(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=int(_first(_meta(md, arch, "feed_forward_length"))),
        n_vocab=int(n_vocab),
        n_ctx_train=int(_meta(md, arch, "context_length", 2048)),
        rope_freq_base=_f32(_meta(md, arch, "rope.freq_base", 10000.0)),
        n_rot=int(_meta(md, arch, "rope.dimension_count", head_dim)),
        rope_scaling_type=scaling,
        rope_scaling_factor=factor or 1.0,
        rope_scaling_orig_ctx=int(_meta(md, arch, "rope.scaling.original_context_length", 0) or 0),
        yarn_ext_factor=float(_meta(md, arch, "rope.scaling.yarn_ext_factor", -1.0)),
        rope_attn_factor=float(_meta(md, arch, "rope.scaling.attn_factor", 1.0)),
        yarn_beta_fast=float(_meta(md, arch, "rope.scaling.yarn_beta_fast", 32.0)),
        yarn_beta_slow=float(_meta(md, arch, "rope.scaling.yarn_beta_slow", 1.0)),
        has_rope_freqs="rope_freqs.weight" in names,
        rms_eps=_f32(_meta(md, arch, "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_neox=SUPPORTED_ARCHS[arch],
        tie_embeddings="output.weight" not in names,
        has_qkv_bias="blk.0.attn_q.bias" in names,
        has_qk_norm="blk.0.attn_q_norm.weight" in names,
        attn_logit_softcap=float(_meta(md, arch, "attn_logit_softcapping", 0.0) or 0.0),
    )



def _load_gguf(path: Path, _progress=print_progress, preloaded=None) -> LoadedModel:
    t0 = time.perf_counter()
    # copy-on-write mapping: writable (no torch warning), pages shared with the page cache; or the
    # one runtime/launch/preload.py read while the server imported (with matrices already repacked)
    gf = preloaded.gguf if preloaded is not None else read_gguf(path, map_data=True)
    packed = preloaded.packed if preloaded is not None else {}
    names = {t.name: t for t in gf.tensors}
    config = _config_from_gguf(gf.metadata, names)

    weights: dict[str, Any] = {}
    n_params = size = 0
    for info in gf.tensors:
        t = _to_torch(tensor_data(gf, info), info.qtype)
        n_params += info.n_elements
        size += info.n_bytes
        if len(info.shape) == 1:
            if info.qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16,
                              GGMLQuantizationType.BF16):
                weights[info.name] = t.to(torch.float32)
            else:
                import kernels  # 1-D quantized: rare

                weights[info.name] = kernels.dequantize(QWeight(t.reshape(1, -1), info.qtype, 1,
                                                        info.shape[0]))[0]
        else:
            cols = info.shape[0]
            rows = info.n_elements // cols
            data = t.reshape(rows, -1)
            weights[info.name] = QWeight(data, info.qtype, rows, cols, mapped=True, repacked=packed.get(info.name))

    archs.split_weights(config, weights)  # phi3: fused attn_qkv / gate+up ffn_up -> separate views
    config.rope_freq_factors = weights.get("rope_freqs.weight")
    ft = gf.metadata.get("general.file_type")
    if ft is None:
        ft = guess_ftype([t.qtype for t in gf.tensors if len(t.shape) >= 2])
    _progress(f"load_model: loaded {len(gf.tensors)}/{len(gf.tensors)} tensors, "
              f"{size / 1e6:.1f} MB in {time.perf_counter() - t0:.2f} s"
              + (f" ({len(packed)} repacked on a thread during start-up, {preloaded.seconds:.2f} s)" if packed else ""))
    return LoadedModel(config=config, weights=weights, file_type=ftype_name(int(ft)),
                       n_params=n_params, size=size, gguf_metadata=gf.metadata, path=str(path),
                       format="gguf", tokenizer=preloaded.tokenizer if preloaded is not None else None)


def load_model(path: str | Path, progress=print_progress, preloaded=None) -> LoadedModel:
    """Load a GGUF file or a HF safetensors folder (config.json + *.safetensors).
    `progress(message)` receives the progress lines (default: printed to stderr). `preloaded`: the
    `runtime.launch.preload.Preloaded` of this GGUF file (its header and repacked matrices)."""
    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ValueError(f"{p}: is a directory, not a GGUF file (nor a Hugging Face model "
                             "folder: it has no config.json)")
        return load_safetensors(p, progress)
    if p.suffix == ".safetensors" and (p.parent / "config.json").exists():
        return load_safetensors(p.parent, progress)
    if not p.exists():
        raise FileNotFoundError(f"model file not found: {p}")
    return _load_gguf(p, progress, preloaded)

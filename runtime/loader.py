"""Model loading: a GGUF file (memory-mapped, zero-copy) or a Hugging Face safetensors folder.

`load_model(path) -> LoadedModel`:

- `config: ModelConfig` — hyper-parameters the forward pass needs.
- `weights: dict[str, QWeight | torch.Tensor]` under GGUF tensor names (`token_embd.weight`,
  `output_norm.weight`, `output.weight` (absent when the embeddings are tied: reuse
  `token_embd.weight`), `blk.{i}.attn_norm.weight`, `blk.{i}.attn_q.weight`, `...attn_k/attn_v/
  attn_output.weight`, `blk.{i}.attn_q.bias` ... (qwen2), `blk.{i}.attn_q_norm.weight` /
  `attn_k_norm.weight` (qwen3), `blk.{i}.ffn_norm.weight`, `ffn_gate/ffn_up/ffn_down.weight`, and
  `rope_freqs.weight` ([n_rot/2] float32 divisors of the rope frequencies, llama3-style, when the
  model has one; also `config.rope_freq_factors`). Matrices are `QWeight` in their file type,
  sharing memory with the file's copy-on-write mapping (writes stay private to the process);
  1-D tensors are float32.
- `file_type` (llama.cpp's ftype name, e.g. "all F32", "Q4_K - Medium"), `n_params`, `size`
  (bytes of tensor data), `gguf_metadata` (all KV metadata as plain Python values).

`read_gguf_metadata(path) -> dict` parses only the KV metadata, much faster than
`gguf.GGUFReader` (which needs ~10 s for a 150k-token vocabulary).
"""
from __future__ import annotations

import json
import math
import mmap
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from kernels.qweight import QWeight

__all__ = [
    "ModelConfig", "LoadedModel", "GGUFTensorInfo", "GGUFFile", "load_model", "read_gguf",
    "read_gguf_metadata", "ftype_name", "SUPPORTED_ARCHS",
]

# arch -> rope style: GGUF llama weights are permuted for the "normal" (pairwise) rope,
# qwen2/qwen3 use NEOX (half-split) rope.
SUPPORTED_ARCHS = {"llama": False, "mistral": False, "qwen2": True, "qwen3": True}


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
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    has_rope_freqs: bool = False  # weights["rope_freqs.weight"] present (llama3 rope)
    rms_eps: float = 1e-5
    rope_neox: bool = False
    tie_embeddings: bool = False
    has_qkv_bias: bool = False
    has_qk_norm: bool = False
    attn_logit_softcap: float = 0.0
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


# ---------------------------------------------------------------------------------------------
# GGUF parsing

_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?",
}
_NP = {
    GGUFValueType.UINT8: np.uint8, GGUFValueType.INT8: np.int8, GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16, GGUFValueType.UINT32: np.uint32, GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32, GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64, GGUFValueType.FLOAT64: np.float64, GGUFValueType.BOOL: np.bool_,
}


@dataclass
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # GGML order: shape[0] = ne0 (contiguous dimension)
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        return self.n_elements // block_size * type_size


@dataclass
class GGUFFile:
    metadata: dict[str, Any]
    value_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]]  # key -> (type, array item type)
    tensors: list[GGUFTensorInfo]
    version: int
    alignment: int
    data_offset: int


class _Cursor:
    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = struct.unpack_from("<Q", self.buf, self.pos)[0]
        start = self.pos + 8
        self.pos = start + n
        raw = bytes(self.buf[start:self.pos])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: GGUFValueType) -> tuple[Any, GGUFValueType | None]:
        if vtype == GGUFValueType.STRING:
            return self.string(), None
        if vtype == GGUFValueType.ARRAY:
            itype = GGUFValueType(self.unpack("<I"))
            n = self.unpack("<Q")
            if itype in _NP:
                dt = np.dtype(_NP[itype]).newbyteorder("<")
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos += n * dt.itemsize
                return arr.tolist(), itype
            if itype == GGUFValueType.STRING:
                buf, pos, out = self.buf, self.pos, []
                unpack = struct.Struct("<Q").unpack_from
                append = out.append
                for _ in range(n):
                    ln = unpack(buf, pos)[0]
                    raw = bytes(buf[pos + 8:pos + 8 + ln])
                    pos += 8 + ln
                    try:
                        append(raw.decode("utf-8"))
                    except UnicodeDecodeError:
                        append(raw.decode("utf-8", errors="surrogateescape"))
                self.pos = pos
                return out, itype
            # nested arrays: rare, parse recursively
            return [self.value(itype)[0] for _ in range(n)], itype
        return self.unpack(_SCALAR[vtype]), None


def _parse_gguf(buf: Any, with_tensors: bool = True) -> GGUFFile:
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    c.pos = 4
    version = c.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version} (big-endian files are not supported)")
    n_tensors = c.unpack("<Q")
    n_kv = c.unpack("<Q")
    metadata: dict[str, Any] = {}
    vtypes: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
    for _ in range(n_kv):
        key = c.string()
        vtype = GGUFValueType(c.unpack("<I"))
        val, itype = c.value(vtype)
        metadata[key] = val
        vtypes[key] = (vtype, itype)
    alignment = int(metadata.get("general.alignment", 32))
    tensors: list[GGUFTensorInfo] = []
    if with_tensors:
        raw_infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.unpack("<I")
            shape = tuple(c.unpack("<Q") for _ in range(n_dims))
            qtype = GGMLQuantizationType(c.unpack("<I"))
            offset = c.unpack("<Q")
            raw_infos.append((name, shape, qtype, offset))
        data_offset = (c.pos + alignment - 1) // alignment * alignment
        tensors = [GGUFTensorInfo(n, s, q, data_offset + o) for n, s, q, o in raw_infos]
    else:
        data_offset = 0
    return GGUFFile(metadata, vtypes, tensors, version, alignment, data_offset)


def read_gguf(path: str | Path, with_tensors: bool = True) -> GGUFFile:
    """Parse a GGUF header: metadata (plain Python values), their types, tensor infos."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            return _parse_gguf(view, with_tensors)
        finally:
            view.release()


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """All KV metadata of a GGUF file as plain Python values (arrays as lists)."""
    return read_gguf(path, with_tensors=False).metadata


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


def _guess_ftype(qtypes: list[GGMLQuantizationType]) -> int:
    if not qtypes:
        return LlamaFileType.ALL_F32 | LlamaFileType.GUESSED
    most = Counter(qtypes).most_common(1)[0][0]
    return int(_GUESS.get(most, LlamaFileType.ALL_F32)) | LlamaFileType.GUESSED


# ---------------------------------------------------------------------------------------------
# GGUF model loading


def _np_view(mm: np.ndarray, info: GGUFTensorInfo) -> np.ndarray:
    """The tensor's bytes in the memory map, viewed with its GGML shape reversed (row-major)."""
    raw = mm[info.offset:info.offset + info.n_bytes]
    shape = tuple(reversed(info.shape))
    if info.qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape)
    if info.qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(shape)
    if info.qtype == GGMLQuantizationType.BF16:
        return raw.view(np.int16).reshape(shape)
    # quantized: [..., row_bytes]
    block_size, type_size = GGML_QUANT_SIZES[info.qtype]
    return raw.reshape(*shape[:-1], info.shape[0] // block_size * type_size)


def _to_torch(arr: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    t = torch.from_numpy(arr)
    if qtype == GGMLQuantizationType.BF16:
        t = t.view(torch.bfloat16)
    return t


def _meta(md: dict[str, Any], arch: str, key: str, default: Any = None) -> Any:
    return md.get(f"{arch}.{key}", default)


def _f32(v: Any) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(v)))


def _config_from_gguf(md: dict[str, Any], names: dict[str, GGUFTensorInfo]) -> ModelConfig:
    arch = md.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported model architecture {arch!r} "
                         f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    n_embd = int(_meta(md, arch, "embedding_length"))
    n_head = int(_meta(md, arch, "attention.head_count"))
    n_head_kv = int(_meta(md, arch, "attention.head_count_kv", n_head))
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
        n_ff=int(_meta(md, arch, "feed_forward_length")),
        n_vocab=int(n_vocab),
        n_ctx_train=int(_meta(md, arch, "context_length", 2048)),
        rope_freq_base=_f32(_meta(md, arch, "rope.freq_base", 10000.0)),
        n_rot=int(_meta(md, arch, "rope.dimension_count", head_dim)),
        rope_scaling_type=scaling,
        rope_scaling_factor=factor or 1.0,
        rope_scaling_orig_ctx=int(_meta(md, arch, "rope.scaling.original_context_length", 0) or 0),
        yarn_ext_factor=float(_meta(md, arch, "rope.scaling.yarn_ext_factor", -1.0)),
        yarn_attn_factor=float(_meta(md, arch, "rope.scaling.yarn_attn_factor",
                                     _meta(md, arch, "rope.scaling.attn_factor", 1.0))),
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


def _print_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load_gguf(path: Path, _progress=_print_progress) -> LoadedModel:
    t0 = time.perf_counter()
    # copy-on-write mapping: writable (no torch warning), pages shared with the page cache
    mm = np.memmap(path, dtype=np.uint8, mode="c")
    gf = _parse_gguf(memoryview(mm))
    names = {t.name: t for t in gf.tensors}
    config = _config_from_gguf(gf.metadata, names)

    weights: dict[str, Any] = {}
    n_params = size = 0
    for info in gf.tensors:
        if info.offset + info.n_bytes > mm.shape[0]:
            raise ValueError(f"tensor {info.name!r} data is out of the file bounds (truncated file?)")
        arr = _np_view(mm, info)
        t = _to_torch(arr, info.qtype)
        n_params += info.n_elements
        size += info.n_bytes
        if len(info.shape) == 1:
            if info.qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16,
                              GGMLQuantizationType.BF16):
                weights[info.name] = t.to(torch.float32)
            else:
                from kernels.dequant_ref import dequantize  # 1-D quantized: rare

                weights[info.name] = dequantize(QWeight(t.reshape(1, -1), info.qtype, 1,
                                                        info.shape[0]))[0]
        else:
            cols = info.shape[0]
            rows = info.n_elements // cols
            data = t.reshape(rows, -1)
            weights[info.name] = QWeight(data, info.qtype, rows, cols)

    config.rope_freq_factors = weights.get("rope_freqs.weight")
    ft = gf.metadata.get("general.file_type")
    if ft is None:
        ft = _guess_ftype([t.qtype for t in gf.tensors if len(t.shape) >= 2])
    _progress(f"load_model: loaded {len(gf.tensors)}/{len(gf.tensors)} tensors, "
              f"{size / 1e6:.1f} MB in {time.perf_counter() - t0:.2f} s")
    return LoadedModel(config=config, weights=weights, file_type=ftype_name(int(ft)),
                       n_params=n_params, size=size, gguf_metadata=gf.metadata, path=str(path),
                       format="gguf")


# ---------------------------------------------------------------------------------------------
# safetensors folders

_HF_ARCH = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
}

_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def hf_to_gguf_name(name: str) -> str | None:
    """HF tensor name -> GGUF name; None for tensors the runtime does not use."""
    if name in _HF_GLOBAL_NAMES:
        return _HF_GLOBAL_NAMES[name]
    if name.startswith("model.layers."):
        rest = name[len("model.layers."):]
        idx, _, sub = rest.partition(".")
        if sub in _HF_LAYER_NAMES:
            return f"blk.{int(idx)}.{_HF_LAYER_NAMES[sub]}"
    return None


def _llama3_rope_factors(cfg: dict[str, Any], head_dim: int, base: float) -> torch.Tensor:
    """rope_freqs.weight [head_dim/2] as convert_hf_to_gguf.py computes it for llama3 rope."""
    rs = cfg["rope_scaling"]
    factor = float(rs.get("factor", 8.0))
    low = float(rs.get("low_freq_factor", 1.0))
    high = float(rs.get("high_freq_factor", 4.0))
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def _load_safetensors(folder: Path, _progress=_print_progress) -> LoadedModel:
    from safetensors import safe_open

    t0 = time.perf_counter()
    cfg = json.loads((folder / "config.json").read_text())
    model_type = cfg.get("model_type") or (cfg.get("architectures") or [""])[0]
    arch = _HF_ARCH.get(model_type) or _HF_ARCH.get((cfg.get("architectures") or [""])[0])
    if arch is None:
        raise ValueError(f"unsupported model type {model_type!r} in {folder / 'config.json'}")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")

    weights: dict[str, Any] = {}
    n_params = size = 0
    qtypes: list[GGMLQuantizationType] = []
    for fpath in files:
        with safe_open(str(fpath), framework="pt") as f:
            for hf_name in f.keys():
                name = hf_to_gguf_name(hf_name)
                if name is None:
                    continue
                t = f.get_tensor(hf_name)
                if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                    t = t.to(torch.float32)
                n_params += t.numel()
                size += t.numel() * t.element_size()
                if t.dim() == 1:
                    weights[name] = t.to(torch.float32)
                else:
                    w = QWeight.from_float(t.reshape(t.shape[0], -1))
                    weights[name] = w
                    qtypes.append(w.qtype)

    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    base = float(cfg.get("rope_theta", 10000.0))
    tied = bool(cfg.get("tie_word_embeddings", False)) or "output.weight" not in weights
    if tied:
        weights.pop("output.weight", None)
    rs = cfg.get("rope_scaling") or {}
    rs_type = rs.get("rope_type", rs.get("type", "none")) or "none"
    scaling, factor, orig_ctx = "none", 1.0, 0
    if rs_type == "linear":
        scaling, factor = "linear", float(rs.get("factor", 1.0))
    elif rs_type == "yarn":
        scaling, factor = "yarn", float(rs.get("factor", 1.0))
        orig_ctx = int(rs.get("original_max_position_embeddings", 0) or 0)
    elif rs_type == "llama3":
        weights["rope_freqs.weight"] = _llama3_rope_factors(cfg, head_dim, base)
    config = ModelConfig(
        arch=arch,
        n_layer=int(cfg["num_hidden_layers"]),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        head_dim=head_dim,
        n_ff=int(cfg["intermediate_size"]),
        n_vocab=int(weights["token_embd.weight"].rows),
        n_ctx_train=int(cfg.get("max_position_embeddings", 2048)),
        rope_freq_base=base,
        n_rot=head_dim,
        rope_scaling_type=scaling,
        rope_scaling_factor=factor,
        rope_scaling_orig_ctx=orig_ctx,
        yarn_beta_fast=float(rs.get("beta_fast", 32.0)),
        yarn_beta_slow=float(rs.get("beta_slow", 1.0)),
        has_rope_freqs="rope_freqs.weight" in weights,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_neox=True,  # HF weights are not permuted for the pairwise rope
        tie_embeddings=tied,
        has_qkv_bias="blk.0.attn_q.bias" in weights,
        has_qk_norm="blk.0.attn_q_norm.weight" in weights,
    )
    config.rope_freq_factors = weights.get("rope_freqs.weight")
    ft = _guess_ftype(qtypes) & ~LlamaFileType.GUESSED
    n_tensors = len(weights)
    _progress(f"load_model: loaded {n_tensors}/{n_tensors} tensors, {size / 1e6:.1f} MB "
              f"in {time.perf_counter() - t0:.2f} s")
    return LoadedModel(config=config, weights=weights, file_type=ftype_name(ft),
                       n_params=n_params, size=size, gguf_metadata={}, path=str(folder),
                       format="safetensors")


def load_model(path: str | Path, progress=_print_progress) -> LoadedModel:
    """Load a GGUF file or a HF safetensors folder (config.json + *.safetensors).
    `progress(message)` receives the progress lines (default: printed to stderr)."""
    p = Path(path)
    if p.is_dir():
        return _load_safetensors(p, progress)
    if p.suffix == ".safetensors" and (p.parent / "config.json").exists():
        return _load_safetensors(p.parent, progress)
    if not p.exists():
        raise FileNotFoundError(f"model file not found: {p}")
    return _load_gguf(p, progress)

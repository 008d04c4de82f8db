"""A multimodal projector file (llama.cpp's `--mmproj` GGUF, tools/mtmd/clip.cpp's layout): its
hyper-parameters as plain data (`ClipConfig`, one per modality) and its weights.

`read_mmproj(path, image_min_tokens=-1, image_max_tokens=-1) -> MmprojFile`: the file's
`ClipConfig` for vision and for audio (either may be None), and its weights under their GGUF names
(matrices as `QWeight`, 1-D tensors float32, everything else a float32 tensor in numpy's order of
the GGML shape reversed). The keys and defaults are clip.cpp's `load_hparams` for the projector
types tritium runs (`ProjectorType`); any other type is refused with clip.cpp's words.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from kernels.qweight import QWeight
from runtime.model.gguf import read_gguf, tensor_data

__all__ = ["ProjectorType", "FfnOp", "ResizeAlgo", "Modality", "ClipConfig", "MmprojFile", "read_mmproj",
           "mmproj_modalities"]


class ProjectorType(str, enum.Enum):
    """clip.cpp's projector names (`clip.projector_type` / `clip.vision.projector_type`)."""
    GEMMA3 = "gemma3"
    QWEN2VL = "qwen2vl_merger"
    QWEN25VL = "qwen2.5vl_merger"
    QWEN3VL = "qwen3vl_merger"
    QWEN25O = "qwen2.5o"  # Qwen2.5-Omni: QWEN25VL for vision, QWEN2A for audio
    QWEN2A = "qwen2a"


class Modality(str, enum.Enum):
    VISION = "vision"
    AUDIO = "audio"


class FfnOp(str, enum.Enum):
    GELU = "gelu"  # tanh GELU (ggml's float16 table)
    GELU_ERF = "gelu_erf"
    SILU = "silu"
    GELU_QUICK = "gelu_quick"


class ResizeAlgo(str, enum.Enum):
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


# the vision projectors whose language model takes M-RoPE positions (mtmd's MTMD_POS_TYPE_MROPE
# comes from the text model's rope type; these are the projectors of those models)
MROPE_PROJECTORS = (ProjectorType.QWEN2VL, ProjectorType.QWEN25VL, ProjectorType.QWEN3VL)


@dataclass
class ClipConfig:
    """One modality's encoder (clip_hparams of the types tritium runs)."""
    modality: Modality
    proj: ProjectorType
    n_embd: int
    n_ff: int
    n_head: int
    n_layer: int
    projection_dim: int
    eps: float
    ffn_op: FfnOp
    image_size: int = 0
    patch_size: int = 1
    n_merge: int = 1
    image_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    image_std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    resize_algo: ResizeAlgo = ResizeAlgo.BICUBIC
    image_min_pixels: int = -1
    image_max_pixels: int = -1
    n_wa_pattern: int = 0  # qwen2.5-vl: every n-th layer attends globally, the others per 112-pixel window
    n_mel_bins: int = 0  # audio
    proj_stack_factor: int = 0  # audio
    n_embd_out: int = 0  # width of one output embedding (the language model's input width)

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class MmprojFile:
    path: str
    vision: ClipConfig | None
    audio: ClipConfig | None
    weights: dict[str, Any] = field(default_factory=dict)
    name: str = ""


def _get(md: dict, key: str, default: Any = None, required: bool = False) -> Any:
    if key in md:
        return md[key]
    if required:
        raise ValueError(f"clip_model_loader: key not found in model: {key}")
    return default


def _proj_type(md: dict, modality: Modality) -> ProjectorType:
    name = _get(md, "clip.projector_type") or _get(md, f"clip.{modality.value}.projector_type") or ""
    try:
        proj = ProjectorType(name)
    except ValueError:
        raise ValueError(f"load_hparams: unknown projector type: {name}") from None
    if proj is ProjectorType.QWEN25O:
        proj = ProjectorType.QWEN25VL if modality is Modality.VISION else ProjectorType.QWEN2A
    return proj


def _limit_tokens(cfg: ClipConfig, n_min: int, n_max: int, custom_min: int, custom_max: int) -> None:
    """clip_hparams::set_limit_image_tokens: the pixel bounds of the dynamic-size preprocessor."""
    area = cfg.patch_size * cfg.patch_size * cfg.n_merge * cfg.n_merge
    cfg.image_min_pixels = (custom_min if custom_min > 0 else n_min) * area
    cfg.image_max_pixels = (custom_max if custom_max > 0 else n_max) * area


def _config(md: dict, modality: Modality, min_tokens: int, max_tokens: int) -> ClipConfig:
    proj = _proj_type(md, modality)
    p = modality.value
    use_gelu, use_silu = bool(_get(md, "clip.use_gelu", False)), bool(_get(md, "clip.use_silu", False))
    if use_gelu and use_silu:
        raise ValueError("load_hparams: both use_gelu and use_silu are set to true")
    ffn_op = FfnOp.GELU if use_gelu else FfnOp.SILU if use_silu else FfnOp.GELU_QUICK
    cfg = ClipConfig(
        modality=modality, proj=proj,
        n_embd=int(_get(md, f"clip.{p}.embedding_length", required=True)),
        n_ff=int(_get(md, f"clip.{p}.feed_forward_length", required=True)),
        n_head=int(_get(md, f"clip.{p}.attention.head_count", required=True)),
        n_layer=int(_get(md, f"clip.{p}.block_count", required=True)),
        projection_dim=int(_get(md, f"clip.{p}.projection_dim", required=True)),
        eps=float(np.float32(_get(md, f"clip.{p}.attention.layer_norm_epsilon", required=True))),
        ffn_op=ffn_op)
    if modality is Modality.VISION:
        if proj not in (ProjectorType.GEMMA3, *MROPE_PROJECTORS):
            raise ValueError(f"unsupported vision projector type: {proj.value}")
        cfg.image_size = int(_get(md, "clip.vision.image_size", required=True))
        cfg.patch_size = int(_get(md, "clip.vision.patch_size", required=True))
        mean, std = _get(md, "clip.vision.image_mean", []), _get(md, "clip.vision.image_std", [])
        if len(mean) < 3 or len(std) < 3:
            raise ValueError("load_hparams: image_mean/image_std arrays must have at least 3 elements, "
                             f"got {len(mean)} and {len(std)}")
        cfg.image_mean = tuple(float(np.float32(v)) for v in mean[:3])
        cfg.image_std = tuple(float(np.float32(v)) for v in std[:3])
        if proj is ProjectorType.GEMMA3:
            cfg.n_merge = int(_get(md, "clip.vision.projector.scale_factor", 4))
            cfg.resize_algo = ResizeAlgo.BILINEAR
        else:
            cfg.n_merge = int(_get(md, "clip.vision.spatial_merge_size", 2))
            cfg.resize_algo = ResizeAlgo.BICUBIC
            cfg.n_wa_pattern = int(_get(md, "clip.vision.n_wa_pattern", 0, required=proj is ProjectorType.QWEN25VL))
            _limit_tokens(cfg, 8, 4096, min_tokens, max_tokens)
    else:
        if proj is not ProjectorType.QWEN2A:
            raise ValueError(f"unsupported audio projector type: {proj.value}")
        cfg.n_mel_bins = int(_get(md, "clip.audio.num_mel_bins", required=True))
        cfg.proj_stack_factor = int(_get(md, "clip.audio.projector.stack_factor", 0))
        cfg.ffn_op = FfnOp.GELU_ERF
    return cfg


def _tensor(gf, info) -> Any:
    """A matrix as a QWeight ([rows = ne1 * ne2 * ..., cols = ne0]), a vector as float32."""
    arr = tensor_data(gf, info)
    t = torch.from_numpy(arr)
    if info.qtype == GGMLQuantizationType.BF16:
        t = t.view(torch.bfloat16)
    if len(info.shape) == 1:
        if info.qtype not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
            raise ValueError(f"{info.name}: quantized 1-D tensors are not supported")
        return t.to(torch.float32).clone()
    cols = info.shape[0]
    rows = info.n_elements // cols
    return QWeight(t.reshape(rows, -1).clone(), info.qtype, rows, cols)


def mmproj_modalities(path: str | Path) -> tuple[bool, bool]:
    """(has vision, has audio) of an mmproj file, from its header alone."""
    gf = read_gguf(path, with_tensors=False)
    md = gf.metadata
    return bool(md.get("clip.has_vision_encoder", False)), bool(md.get("clip.has_audio_encoder", False))


def read_mmproj(path: str | Path, image_min_tokens: int = -1, image_max_tokens: int = -1) -> MmprojFile:
    """Read an mmproj GGUF (see the module docstring)."""
    gf = read_gguf(path, map_data=True)
    md = gf.metadata
    vision = _config(md, Modality.VISION, image_min_tokens, image_max_tokens) \
        if md.get("clip.has_vision_encoder", False) else None
    audio = _config(md, Modality.AUDIO, -1, -1) if md.get("clip.has_audio_encoder", False) else None
    if vision is None and audio is None:
        raise ValueError(f"Failed to load CLIP model from {path}")
    weights = {info.name: _tensor(gf, info) for info in gf.tensors}
    for cfg in (vision, audio):
        if cfg is not None:
            cfg.n_embd_out = _n_embd_out(cfg, weights)
    if vision is not None and audio is not None and vision.n_embd_out != audio.n_embd_out:
        raise ValueError(f"mismatch between vision and audio mmproj (n_embd_v = {vision.n_embd_out}, "
                         f"n_embd_a = {audio.n_embd_out})")
    return MmprojFile(str(path), vision, audio, weights, str(md.get("general.name", "")))


def _n_embd_out(cfg: ClipConfig, w: dict) -> int:
    """clip_n_mmproj_embd: the projector's output width."""
    if cfg.proj is ProjectorType.GEMMA3:
        return w["mm.input_projection.weight"].cols
    if cfg.proj is ProjectorType.QWEN2A:
        return w["mm.a.fc.weight"].rows
    out = w["mm.2.bias"].shape[0]
    if cfg.proj is ProjectorType.QWEN3VL:
        out *= 1 + sum(1 for i in range(cfg.n_layer) if f"v.deepstack.{i}.fc1.weight" in w)
    return out



"""Tiny random-weight vision-language pairs in llama.cpp's layout: a text model GGUF
(`runtime.model.tiny_model`) and its `--mmproj` GGUF (clip.cpp's keys and tensor names), small
enough for tests, that llama-server b1-0c1e570 loads with `-m MODEL --mmproj MMPROJ`.

`write_pair(out_dir, kind, seed=0, wtype="f16") -> (model_path, mmproj_path)` for `kind` in `KINDS`:

- "gemma3": a 6-layer gemma3 text model (sliding window 512) with a SigLIP encoder (64 px images,
  8 px patches, 2 layers, 2x2 average pool: 16 tokens per image);
- "qwen25vl": a qwen2vl text model (M-RoPE sections 2/3/3/0) with a Qwen2.5-VL encoder (14 px
  patches, RMSNorm, SiLU-gated FFN, window attention every other layer in clip.cpp's 112 px
  windows; dynamic image size);
- "qwen3vl": a qwen3vl text model (interleaved M-RoPE 3/1/1/0, one deepstack layer) with a
  Qwen3-VL encoder (fused qkv, learned position embeddings on an 8x8 grid, a deepstack layer);
- "qwen25o": Qwen2.5-Omni's layout: "qwen25vl"'s text model and vision encoder in a `qwen2.5o`
  file that also holds a Qwen2-Audio encoder (32 mel bins, 1 layer: 750 tokens per 30 s).

The text models use the built-in byte-level vocabulary plus the image (and audio) delimiter tokens
of their family (`<start_of_image>`/`<end_of_image>`, `<|vision_start|>`/`<|vision_end|>`); the
vision matrices are stored in `wtype` (f16 like real mmproj files, or f32), vectors in F32.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from runtime.model.tiny_model import GEMMA3_SPEC, TinyModelSpec, write_tiny_model
from runtime.tokenizer.builtin_vocab import builtin_vocab

__all__ = ["KINDS", "MmprojSpec", "write_mmproj", "write_pair", "vocab_with"]

KINDS = ("gemma3", "qwen25vl", "qwen3vl", "qwen25o")
_SPECIALS = {
    "gemma3": ["<start_of_image>", "<end_of_image>"],
    "qwen25vl": ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"],
    "qwen3vl": ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>"],
    "qwen25o": ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|audio_bos|>", "<|audio_eos|>"],
}
_CLIP_MEAN, _CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class MmprojSpec:
    proj: str  # clip.projector_type
    n_embd: int = 32
    n_ff: int = 64
    n_head: int = 2
    n_layer: int = 2
    image_size: int = 64
    patch_size: int = 8
    n_embd_text: int = 64
    scale_factor: int = 0  # gemma3: clip.vision.projector.scale_factor (0: not written, llama.cpp's 4)
    n_wa_pattern: int = 0  # qwen2.5vl (windows of 112 pixels: clip.cpp reads no window size for it)
    deepstack_layers: tuple[int, ...] = ()  # qwen3vl
    pos_grid: int = 8  # qwen3vl: learned position embeddings on a pos_grid x pos_grid grid
    eps: float = 1e-6
    audio: bool = False  # qwen2.5o: an audio encoder too (Whisper-style, qwen2a)
    a_n_embd: int = 32
    a_n_ff: int = 64
    a_n_head: int = 2
    a_n_layer: int = 1
    a_n_mel: int = 32
    wtype: str = "f16"
    seed: int = 0
    std: float = 0.05


def vocab_with(extra: list[str]) -> list:
    """The built-in vocabulary's `tokenizer.*` keys with `extra` control tokens appended."""
    keys = builtin_vocab()
    out = []
    for k, v, t, it in keys:
        if k == "tokenizer.ggml.tokens":
            v = list(v) + list(extra)
        elif k == "tokenizer.ggml.token_type":
            v = list(v) + [3] * len(extra)
        out.append((k, v, t, it))
    return out


def _audio_tensors(spec: MmprojSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen2-Audio's encoder (clip.cpp's qwen2a): two convolutions, 1500 positions, the blocks (no k
    bias), the post-norm and the projection."""
    C, F = spec.a_n_embd, spec.a_n_ff
    out = [("a.conv1d.1.weight", (C, spec.a_n_mel, 3)), ("a.conv1d.1.bias", (C, 1)),  # biases [1, C] in GGML
           ("a.conv1d.2.weight", (C, C, 3)), ("a.conv1d.2.bias", (C, 1)), ("a.position_embd.weight", (1500, C))]
    for i in range(spec.a_n_layer):
        b = f"a.blk.{i}."
        out += [(b + "attn_q.weight", (C, C)), (b + "attn_q.bias", (C,)), (b + "attn_k.weight", (C, C)),
                (b + "attn_v.weight", (C, C)), (b + "attn_v.bias", (C,)), (b + "attn_out.weight", (C, C)),
                (b + "attn_out.bias", (C,)), (b + "ln1.weight", (C,)), (b + "ln1.bias", (C,)),
                (b + "ln2.weight", (C,)), (b + "ln2.bias", (C,)), (b + "ffn_up.weight", (F, C)),
                (b + "ffn_up.bias", (F,)), (b + "ffn_down.weight", (C, F)), (b + "ffn_down.bias", (C,))]
    return out + [("a.post_ln.weight", (C,)), ("a.post_ln.bias", (C,)),
                  ("mm.a.fc.weight", (spec.n_embd_text, C)), ("mm.a.fc.bias", (spec.n_embd_text,))]


def _tensors(spec: MmprojSpec) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor of the file, in order."""
    C, F, p = spec.n_embd, spec.n_ff, spec.patch_size
    qwen = spec.proj != "gemma3"
    out: list[tuple[str, tuple[int, ...]]] = [("v.patch_embd.weight", (C, 3, p, p))]
    if qwen:
        out.append(("v.patch_embd.weight.1", (C, 3, p, p)))
    if spec.proj in ("gemma3", "qwen3vl_merger"):
        out.append(("v.patch_embd.bias", (C,)))
    if spec.proj == "gemma3":
        out.append(("v.position_embd.weight", ((spec.image_size // p) ** 2, C)))
    if spec.proj == "qwen3vl_merger":
        out.append(("v.position_embd.weight", (spec.pos_grid ** 2, C)))
    rms = spec.proj in ("qwen2.5vl_merger", "qwen2.5o")
    for i in range(spec.n_layer):
        b = f"v.blk.{i}."
        if spec.proj == "qwen3vl_merger":
            out += [(b + "attn_qkv.weight", (3 * C, C)), (b + "attn_qkv.bias", (3 * C,))]
        else:
            for n in ("q", "k", "v"):
                out += [(b + f"attn_{n}.weight", (C, C)), (b + f"attn_{n}.bias", (C,))]
        out += [(b + "attn_out.weight", (C, C)), (b + "attn_out.bias", (C,))]
        for ln in ("ln1", "ln2"):
            out.append((b + f"{ln}.weight", (C,)))
            if not rms:
                out.append((b + f"{ln}.bias", (C,)))
        if rms:  # SiLU-gated FFN
            out += [(b + "ffn_gate.weight", (F, C)), (b + "ffn_gate.bias", (F,))]
        out += [(b + "ffn_up.weight", (F, C)), (b + "ffn_up.bias", (F,)),
                (b + "ffn_down.weight", (C, F)), (b + "ffn_down.bias", (C,))]
        if i in spec.deepstack_layers:
            d = f"v.deepstack.{i}."
            out += [(d + "norm.weight", (4 * C,)), (d + "norm.bias", (4 * C,)),
                    (d + "fc1.weight", (4 * C, 4 * C)), (d + "fc1.bias", (4 * C,)),
                    (d + "fc2.weight", (spec.n_embd_text, 4 * C)), (d + "fc2.bias", (spec.n_embd_text,))]
    out.append(("v.post_ln.weight", (C,)))
    if not rms:
        out.append(("v.post_ln.bias", (C,)))
    if spec.proj == "gemma3":
        out += [("mm.soft_emb_norm.weight", (C,)), ("mm.input_projection.weight", (C, spec.n_embd_text))]
    else:
        out += [("mm.0.weight", (4 * C, 4 * C)), ("mm.0.bias", (4 * C,)),
                ("mm.2.weight", (spec.n_embd_text, 4 * C)), ("mm.2.bias", (spec.n_embd_text,))]
    return out + (_audio_tensors(spec) if spec.audio else [])


def write_mmproj(path: str | Path, spec: MmprojSpec) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "clip")
    w.add_name(f"tiny-random-mmproj-{spec.proj}")
    w.add_file_type(1 if spec.wtype == "f16" else 0)
    w.add_key_value("clip.projector_type", spec.proj, GGUFValueType.STRING)
    w.add_key_value("clip.has_vision_encoder", True, GGUFValueType.BOOL)
    act = {"gemma3": "clip.use_gelu", "qwen2.5vl_merger": "clip.use_silu", "qwen3vl_merger": "clip.use_gelu",
           "qwen2.5o": "clip.use_silu"}
    w.add_key_value(act[spec.proj], True, GGUFValueType.BOOL)
    if spec.audio:
        w.add_key_value("clip.has_audio_encoder", True, GGUFValueType.BOOL)
        for key, val in (("embedding_length", spec.a_n_embd), ("feed_forward_length", spec.a_n_ff),
                         ("block_count", spec.a_n_layer), ("attention.head_count", spec.a_n_head),
                         ("projection_dim", spec.n_embd_text), ("num_mel_bins", spec.a_n_mel)):
            w.add_key_value(f"clip.audio.{key}", val, GGUFValueType.UINT32)
        w.add_key_value("clip.audio.attention.layer_norm_epsilon", 1e-5, GGUFValueType.FLOAT32)
    u32 = GGUFValueType.UINT32
    for key, val in (("embedding_length", spec.n_embd), ("feed_forward_length", spec.n_ff),
                     ("block_count", spec.n_layer), ("attention.head_count", spec.n_head),
                     ("projection_dim", spec.n_embd_text)):
        w.add_key_value(f"clip.vision.{key}", val, u32)
    w.add_key_value("clip.vision.attention.layer_norm_epsilon", spec.eps, GGUFValueType.FLOAT32)
    w.add_key_value("clip.vision.image_size", spec.image_size, u32)
    w.add_key_value("clip.vision.patch_size", spec.patch_size, u32)
    mean, std = ([0.5] * 3, [0.5] * 3) if spec.proj == "gemma3" else (_CLIP_MEAN, _CLIP_STD)
    arr = GGUFValueType.ARRAY
    w.add_key_value("clip.vision.image_mean", mean, arr, sub_type=GGUFValueType.FLOAT32)
    w.add_key_value("clip.vision.image_std", std, arr, sub_type=GGUFValueType.FLOAT32)
    if spec.scale_factor:
        w.add_key_value("clip.vision.projector.scale_factor", spec.scale_factor, u32)
    if spec.proj in ("qwen2.5vl_merger", "qwen2.5o"):
        w.add_key_value("clip.vision.n_wa_pattern", spec.n_wa_pattern, u32)
    rng = np.random.default_rng(spec.seed)
    qt = GGMLQuantizationType.F16 if spec.wtype == "f16" else GGMLQuantizationType.F32
    for name, shape in _tensors(spec):
        x = rng.standard_normal(shape, dtype=np.float32) * spec.std
        if len(shape) == 1:
            if "ln" in name or "norm" in name:
                x = (1.0 + x * 4).astype(np.float32) if name.endswith("weight") else x
            w.add_tensor(name, x.astype(np.float32))
            continue
        if name.startswith(("v.position_embd", "a.position_embd")) or name.endswith("conv1d.1.bias") \
                or name.endswith("conv1d.2.bias"):
            x = x * 4  # comparable to the patch embeddings
            w.add_tensor(name, x.astype(np.float32))
            continue
        w.add_tensor(name, x.astype(np.float16) if qt == GGMLQuantizationType.F16 else x, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _text_spec(kind: str, seed: int) -> TinyModelSpec:
    """The text model of a pair: weights larger than the other tiny models' (qwen: init_std 0.12), so that
    greedy choices are clear-cut (a random model's next-token distribution is otherwise nearly flat,
    and float noise of 1e-4 flips near-ties)."""
    if kind == "gemma3":
        # its sliding window holds the whole context, as a real Gemma 3's (512 / 1024) holds a chat
        # with an image (256 tokens): a reused prompt is then the prompt cache's business alone
        return replace(GEMMA3_SPEC, name="tiny-random-gemma3-vision", seed=seed + 11, init_std=0.05,
                       sliding_window=512)
    base = TinyModelSpec(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=1024, head_dim=16,
                         rope_freq_base=10000.0, rms_eps=1e-6, seed=seed + 11, init_std=0.12)
    if kind in ("qwen25vl", "qwen25o"):
        return replace(base, arch="qwen2vl", name=f"tiny-random-{kind}", rope_sections=(2, 3, 3, 0))
    return replace(base, arch="qwen3vl", name="tiny-random-qwen3-vl", rope_sections=(3, 1, 1, 0), n_deepstack=1)


def _mmproj_spec(kind: str, n_embd_text: int, seed: int, wtype: str) -> MmprojSpec:
    if kind == "gemma3":
        return MmprojSpec("gemma3", n_embd_text=n_embd_text, scale_factor=2, seed=seed, wtype=wtype)
    if kind in ("qwen25vl", "qwen25o"):
        return MmprojSpec("qwen2.5o" if kind == "qwen25o" else "qwen2.5vl_merger", n_embd_text=n_embd_text,
                          n_wa_pattern=2, patch_size=14, image_size=56, seed=seed, wtype=wtype, audio=kind == "qwen25o")
    return MmprojSpec("qwen3vl_merger", n_embd_text=n_embd_text, deepstack_layers=(0,), seed=seed, wtype=wtype)


def write_pair(out_dir: str | Path, kind: str, seed: int = 0, wtype: str = "f16") -> tuple[Path, Path]:
    """The text model and the mmproj of `kind` (see the module docstring) in `out_dir`."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    out_dir = Path(out_dir)
    text = _text_spec(kind, seed)
    model = write_tiny_model(out_dir / f"tiny-{kind}-model.gguf", text, vocab=vocab_with(_SPECIALS[kind]))
    mmproj = write_mmproj(out_dir / f"tiny-{kind}-mmproj-{wtype}.gguf", _mmproj_spec(kind, text.n_embd, seed, wtype))
    return model, mmproj

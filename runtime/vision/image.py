"""Images as llama.cpp b1-0c1e570's mtmd prepares them (tools/mtmd/mtmd-image.cpp): decoded to
8-bit RGB (`kernels.decode_image`: stb_image), resized with its Pillow-compatible separable filter
(fixed-point weights of 22 bits, horizontal pass then vertical), padded to keep the aspect ratio
(PAD_CEIL), then scaled to [0, 1] and normalized per channel in float32.

- `decode(data, max_pixels) -> RGB` (uint8 [H, W, 3]) or `MediaError`;
- `preprocess(cfg, rgb) -> float32 [H', W', 3]`: Gemma 3's fixed square (bilinear), Qwen-VL's
  dynamic size (bicubic, `smart_size`: aligned to patch_size * n_merge within the pixel bounds);
- `resize(rgb, w, h, algo)`: the filter alone (`img_tool::resize_pillow`).
"""
from __future__ import annotations

import math

import numpy as np

import kernels
from runtime.vision.mmproj import ClipConfig, ProjectorType, ResizeAlgo

__all__ = ["MediaError", "decode", "resize", "resize_pad", "smart_size", "preprocess", "MAX_IMAGE_PIXELS"]

# the largest image decoded (pixels): stb_image itself allows 2^24 per side; 8192 x 8192 RGB is 192 MiB
MAX_IMAGE_PIXELS = 8192 * 8192
_PRECISION_BITS = 32 - 8 - 2
_SUPPORT = {ResizeAlgo.BILINEAR: 1.0, ResizeAlgo.BICUBIC: 2.0}
f32 = np.float32


class MediaError(ValueError):
    """A prompt's media that cannot be used (the request's error, not the server's): `public` is
    llama-server's message for it, str(e) the reason (for the log)."""
    public = "Failed to load image or audio file"


class MediaTokenizeError(MediaError):
    """The media and the prompt's markers do not fit together (mtmd_tokenize failed)."""
    public = "Failed to tokenize prompt"


def decode(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """uint8 [H, W, 3] of an encoded image (stb_image's formats: JPEG, PNG, BMP, GIF, TGA, PSD, PNM, HDR)."""
    from kernels.cpu.image import ImageTooLarge

    try:
        out = kernels.decode_image(bytes(data), max_pixels)
    except ImageTooLarge as e:
        raise MediaError(str(e)) from None
    if out is None:
        raise MediaError("Failed to load image or audio file")
    w, h, px = out
    return np.frombuffer(px, dtype=np.uint8).reshape(h, w, 3)


def _filter(algo: ResizeAlgo, x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    if algo is ResizeAlgo.BILINEAR:
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _weights(in_size: int, out_size: int, algo: ResizeAlgo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pillow's precompute_coeffs: per output pixel its first input pixel, count and fixed-point
    weights ([out, ksize] int64, zero past the count)."""
    scale = filterscale = in_size / out_size
    if filterscale < 1.0:
        filterscale = 1.0
    support = _SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    xmins = np.zeros(out_size, dtype=np.int64)
    counts = np.zeros(out_size, dtype=np.int64)
    w = np.zeros((out_size, ksize), dtype=np.float64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        k = _filter(algo, (np.arange(xmax) + xmin - center + 0.5) * ss)
        ww = 0.0
        for v in k:  # the same summation order as the C loop
            ww += v
        if ww != 0.0:
            k = k / ww
        w[xx, :xmax] = k
        xmins[xx], counts[xx] = xmin, xmax
    fx = w * float(1 << _PRECISION_BITS)
    fixed = np.trunc(fx + np.where(w < 0, -0.5, 0.5)).astype(np.int64)
    return xmins, counts, fixed


def _pass(src: np.ndarray, out_size: int, algo: ResizeAlgo, axis: int) -> np.ndarray:
    """One separable pass over `axis` (1: horizontal, 0: vertical) of uint8 [H, W, 3]."""
    in_size = src.shape[axis]
    xmins, counts, fixed = _weights(in_size, out_size, algo)
    shape = list(src.shape)
    shape[axis] = out_size
    acc = np.full(shape, 1 << (_PRECISION_BITS - 1), dtype=np.int64)
    for k in range(fixed.shape[1]):
        idx = np.minimum(xmins + k, in_size - 1)
        wk = np.where(k < counts, fixed[:, k], 0)
        if axis == 1:
            acc += src[:, idx, :].astype(np.int64) * wk[None, :, None]
        else:
            acc += src[idx, :, :].astype(np.int64) * wk[:, None, None]
    return np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)


def resize(rgb: np.ndarray, width: int, height: int, algo: ResizeAlgo) -> np.ndarray:
    """llama.cpp's `resize_pillow` (the same as Pillow's Image.resize for these filters)."""
    if not (0 < width <= 65536 and 0 < height <= 65536):
        raise MediaError(f"resize target {width}x{height} is out of range (max 65536)")
    out = rgb
    if width != rgb.shape[1]:
        out = _pass(out, width, algo, 1)
    if height != rgb.shape[0]:
        out = _pass(out, height, algo, 0)
    return out


def resize_pad(rgb: np.ndarray, width: int, height: int, algo: ResizeAlgo) -> np.ndarray:
    """img_tool::resize with PAD_CEIL and black padding: the aspect ratio kept (float32 scale, sides
    rounded up), the picture centred on a black canvas of the target size."""
    h, w = rgb.shape[:2]
    if (w, h) == (width, height):
        return rgb.copy()
    scale = min(f32(width) / f32(w), f32(height) / f32(h))
    nw = min(int(math.ceil(f32(w) * scale)), width)
    nh = min(int(math.ceil(f32(h) * scale)), height)
    small = resize(rgb, nw, nh, algo)
    out = np.zeros((height, width, 3), dtype=np.uint8)
    ox, oy = (width - nw) // 2, (height - nh) // 2
    out[oy:oy + nh, ox:ox + nw] = small
    return out


def _round_half_away(x: np.float32) -> int:
    return int(math.floor(abs(float(x)) + 0.5)) * (1 if x >= 0 else -1)


def smart_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """img_tool::calc_size_preserved_ratio (transformers' smart_resize) in float32 as mtmd computes it."""
    fa = f32(align)

    def by_round(x) -> int:
        return _round_half_away(f32(x) / fa) * align

    def by_ceil(x) -> int:
        return int(math.ceil(f32(x) / fa)) * align

    def by_floor(x) -> int:
        return int(math.floor(f32(x) / fa)) * align

    w_bar = max(align, by_round(width))
    h_bar = max(align, by_round(height))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(f32(height) * f32(width)) / f32(max_pixels), dtype=np.float32)
        h_bar = max(align, by_floor(f32(height) / beta))
        w_bar = max(align, by_floor(f32(width) / beta))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / f32(f32(height) * f32(width)), dtype=np.float32)
        h_bar = by_ceil(f32(height) * beta)
        w_bar = by_ceil(f32(width) * beta)
    return w_bar, h_bar


def target_size(cfg: ClipConfig, width: int, height: int) -> tuple[int, int]:
    """The preprocessed image's (width, height)."""
    if cfg.proj is ProjectorType.GEMMA3:
        return cfg.image_size, cfg.image_size
    return smart_size(width, height, cfg.patch_size * cfg.n_merge, cfg.image_min_pixels, cfg.image_max_pixels)


def normalize(rgb: np.ndarray, mean, std) -> np.ndarray:
    """clip_image_f32::from_u8 then normalize: (u8 / 255 - mean) / std per channel, float32."""
    x = rgb.astype(np.float32) / f32(255.0)
    return (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)


def preprocess(cfg: ClipConfig, rgb: np.ndarray) -> np.ndarray:
    """float32 [H', W', 3]: what the encoder reads (mtmd's fixed-size / dyn-size preprocessors)."""
    w, h = target_size(cfg, rgb.shape[1], rgb.shape[0])
    return normalize(resize_pad(rgb, w, h, cfg.resize_algo), cfg.image_mean, cfg.image_std)

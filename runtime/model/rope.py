"""RoPE frequencies as llama.cpp b1-0c1e570 computes them (ggml_rope_ext's angle chain, linear scaling,
llama3 frequency factors, YaRN's ramp and magnitude scale), for `runtime.model.decoder.Model` and the
architectures' per-layer RoPE (runtime/model/arch/)."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np
import torch


def rope_inv_freq(cfg) -> torch.Tensor:
    """inv_freq [D/2] float32 including linear scaling, llama3 frequency factors and YaRN.

    YaRN (as ggml's rope): each dimension mixes the interpolated angle (freq_scale * theta) and the
    extrapolated one (theta) with a ramp between the correction dimensions; the angle stays linear
    in the position, so the mix folds into an effective inverse frequency. Its magnitude factor is
    `rope_mscale` (inside the rope op, on cos and sin, as ggml's)."""
    d = getattr(cfg, "n_rot", 0) or cfg.head_dim  # rotated dims (partial rope: the first n_rot of each head)
    base = float(getattr(cfg, "rope_freq_base", 10000.0) or 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scale_type = getattr(cfg, "rope_scaling_type", None) or "none"
    factor = float(getattr(cfg, "rope_scaling_factor", 0.0) or 0.0)
    if scale_type == "linear" and factor > 0:
        inv = inv / factor
    elif scale_type == "yarn" and factor > 0:
        freq_scale = 1.0 / factor
        ext = _yarn_ext_factor(cfg)
        if ext != 0.0:
            low, high = _yarn_corr_dims(cfg, d, base)
            i0 = torch.arange(0, d, 2, dtype=torch.float64)
            y = (i0 / 2 - low) / max(0.001, high - low)
            mix = (1 - y.clamp(0.0, 1.0)) * ext
        else:
            mix = torch.zeros(d // 2, dtype=torch.float64)
        inv = inv * (freq_scale * (1 - mix) + mix)
    freq_factors = getattr(cfg, "rope_freq_factors", None)
    if freq_factors is not None:
        inv = inv / freq_factors.to(torch.float64)
    return inv.to(torch.float32)


def rope_theta_scale(cfg, base: float | None = None) -> float:
    """ggml's theta_scale, powf(base, -2 / n_dims) in float32 as its CPU rope computes it, when the
    layer's angles are ggml's plain chain (no YaRN mix, no frequency factors); else 0.0 (the angles
    then come from inv_freq)."""
    scale_type = getattr(cfg, "rope_scaling_type", None) or "none"
    factor = float(getattr(cfg, "rope_scaling_factor", 0.0) or 0.0)
    if getattr(cfg, "rope_freq_factors", None) is not None or (scale_type == "yarn" and factor > 0):
        return 0.0
    if scale_type not in ("none", "linear"):
        return 0.0
    base = float(base if base is not None else (getattr(cfg, "rope_freq_base", 10000.0) or 10000.0))
    n_dims = getattr(cfg, "n_rot", 0) or cfg.head_dim
    return float(_libm().powf(ctypes.c_float(base), ctypes.c_float(_f32_div(-2.0, float(n_dims)))))


def _f32_div(a: float, b: float) -> float:
    """a / b rounded to float32 as C's float division (-2.0f / n_dims)."""
    return float(torch.tensor(a, dtype=torch.float32) / torch.tensor(b, dtype=torch.float32))


@functools.cache
def _libm():
    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    lib.powf.restype, lib.powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    lib.logf.restype, lib.logf.argtypes = ctypes.c_float, [ctypes.c_float]
    lib.fmaf.restype, lib.fmaf.argtypes = ctypes.c_float, [ctypes.c_float] * 3
    return lib


def _yarn_ext_factor(cfg) -> float:
    ext = float(getattr(cfg, "yarn_ext_factor", -1.0))
    return 1.0 if ext < 0 else ext  # llama.cpp: -1 means 1.0 for YaRN


def _yarn_corr_dims(cfg, n_dims: int, base: float) -> tuple[float, float]:
    n_ctx_orig = int(getattr(cfg, "rope_scaling_orig_ctx", 0) or getattr(cfg, "n_ctx_train", 0) or 4096)

    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    start = math.floor(corr_dim(float(getattr(cfg, "yarn_beta_fast", 32.0))))
    end = math.ceil(corr_dim(float(getattr(cfg, "yarn_beta_slow", 1.0))))
    return max(0.0, start), min(n_dims - 1.0, end)


def rope_mscale(cfg, layer_freq_scale: float | None = None) -> float:
    """The factor ggml_rope_ext multiplies cos and sin by (its `mscale`), in float32 as llama.cpp
    b1-0c1e570 computes it, so that q and k (and the cached keys) carry it as llama.cpp's do:
    llama_context's cparams.yarn_attn_factor (`yarn_attn_factor`: --yarn-attn-factor, 1 by default;
    with YaRN's ext_factor != 0 replaced by get_mscale(f, 1) [/ get_mscale(f, yarn_log_mul)] times
    1 / (1 + 0.1 logf(f)), f = 1 / freq_scale) times the file's `rope.scaling.attn_factor`
    (`rope_attn_factor`); with ext_factor != 0 ggml's rope multiplies it by fmaf(0.1, logf(1 /
    freq_scale), 1) (ggml-cpu is built with FMA contraction, libllama without). `layer_freq_scale`:
    the freq_scale of the layer's own rope call where it is not the model's (gemma's local layers: 1)."""
    f32 = np.float32
    scale_type = getattr(cfg, "rope_scaling_type", None) or "none"
    factor = float(getattr(cfg, "rope_scaling_factor", 0.0) or 0.0)
    freq_scale = f32(1.0) / f32(factor) if scale_type in ("linear", "yarn") and factor > 0 else f32(1.0)
    ext = float(getattr(cfg, "yarn_ext_factor", -1.0))
    ext = (1.0 if scale_type == "yarn" else 0.0) if ext < 0 else ext
    a = f32(getattr(cfg, "yarn_attn_factor", 1.0))
    libm = _libm()
    if ext != 0.0:
        fc = f32(1.0) / freq_scale

        def get_mscale(scale, m):
            return f32(1.0) if scale <= 1.0 else f32(f32(0.1) * f32(m)) * f32(libm.logf(float(scale))) + f32(1.0)

        log_mul = float(getattr(cfg, "yarn_log_mul", 0.0) or 0.0)
        a = get_mscale(fc, 1.0) / get_mscale(fc, log_mul) if log_mul else get_mscale(fc, 1.0)
        a = a * (f32(1.0) / (f32(1.0) + f32(0.1) * f32(libm.logf(float(fc)))))
    a = f32(a * f32(getattr(cfg, "rope_attn_factor", 1.0)))
    if ext != 0.0:
        fs = freq_scale if layer_freq_scale is None else f32(layer_freq_scale)
        a = a * f32(libm.fmaf(0.1, libm.logf(float(f32(1.0) / fs)), 1.0))
    return float(f32(a))

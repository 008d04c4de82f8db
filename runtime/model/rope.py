"""RoPE frequencies as llama.cpp b1-0c1e570 computes them (ggml_rope_ext's angle chain, linear scaling,
llama3 frequency factors, YaRN's ramp and magnitude scale), for `runtime.model.decoder.Model` and the
architectures' per-layer RoPE (runtime/model/arch/)."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import torch


def rope_inv_freq(cfg) -> torch.Tensor:
    """inv_freq [D/2] float32 including linear scaling, llama3 frequency factors and YaRN.

    YaRN (as ggml's rope): each dimension mixes the interpolated angle (freq_scale * theta) and the
    extrapolated one (theta) with a ramp between the correction dimensions; the angle stays linear
    in the position, so the mix folds into an effective inverse frequency. Its magnitude factor is
    `rope_attn_scale` (applied to the attention scores)."""
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


def rope_attn_scale(cfg) -> float:
    """Factor on the attention scores from YaRN's magnitude scaling (1.0 otherwise): ggml scales
    cos and sin by mscale, i.e. both q and k, so the scores by mscale^2."""
    if (getattr(cfg, "rope_scaling_type", None) or "none") != "yarn":
        return 1.0
    factor = float(getattr(cfg, "rope_scaling_factor", 0.0) or 0.0)
    mscale = float(getattr(cfg, "yarn_attn_factor", 1.0) or 1.0)
    if factor > 0 and _yarn_ext_factor(cfg) != 0.0:
        mscale *= 1.0 + 0.1 * math.log(factor)
    return mscale * mscale

"""Audio as llama.cpp b1-0c1e570's mtmd takes it for Qwen2.5-Omni's audio projector (`qwen2a`,
tools/mtmd/mtmd-audio.cpp + models/whisper-enc.cpp):

- `decode_wav(data, rate)`: a RIFF/WAVE file to float32 mono samples as miniaudio converts them
  (PCM u8 / s16 / s24 / s32 / float32, channels averaged); another sample rate is resampled
  linearly (miniaudio adds a low-pass filter there: such files differ slightly). MP3 and FLAC,
  which llama-server decodes with miniaudio too, are not read here (the request's 400);
- `log_mel(cfg, samples)`: Whisper's log-mel frames (n_fft 400, hop 160, Slaney mel filters with
  area norm, log10 floored at 5.96e-8, clamped to max - 8, (x + 4) / 4) after 30 s of zero padding
  and a reflected start, cut into chunks of 3000 frames (30 s; a last incomplete chunk is dropped);
- `AudioEncoder`: two 1-D convolutions (GELU-erf, the second with stride 2), learned positions, the
  transformer, a stride-2 average pool, the post-norm and the projection: 750 tokens per chunk.
"""
from __future__ import annotations

import math
import struct

import numpy as np
import torch

import kernels
from kernels.qweight import FLOAT_TYPES, QWeight
from runtime.vision.image import MediaError, MediaTokenizeError
from runtime.vision.mmproj import ClipConfig, MmprojFile

__all__ = ["decode_wav", "log_mel", "AudioEncoder", "audio_chunks", "SAMPLE_RATE"]

SAMPLE_RATE, N_FFT, HOP, CHUNK_FRAMES = 16000, 400, 160, 3000
MAX_AUDIO_SECONDS = 600  # a clip's length bound (tritium's: 20 chunks of 750 tokens)


def decode_wav(data: bytes, rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 [n] mono samples at `rate` of a WAV file (see the module docstring)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise MediaError("Unable to read WAV audio file from buffer")
    fmt = body = None
    off = 12
    while off + 8 <= len(data):
        cid, size = data[off:off + 4], struct.unpack_from("<I", data, off + 4)[0]
        chunk = data[off + 8:off + 8 + size]
        if cid == b"fmt ":
            fmt = chunk
        elif cid == b"data":
            body = chunk
        off += 8 + size + (size & 1)
    if fmt is None or body is None or len(fmt) < 16:
        raise MediaError("Unable to read WAV audio file from buffer")
    tag, channels, src_rate, _, _, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == 0xFFFE and len(fmt) >= 26:  # WAVE_FORMAT_EXTENSIBLE: the subformat's tag
        tag = struct.unpack_from("<H", fmt, 24)[0]
    if channels == 0 or src_rate == 0:
        raise MediaError("Unable to read WAV audio file from buffer")
    width = bits // 8
    n = len(body) // (width * channels) if width else 0
    if n * channels > MAX_AUDIO_SECONDS * src_rate * channels:
        raise MediaError(f"audio longer than {MAX_AUDIO_SECONDS} s")
    raw = body[:n * width * channels]
    if tag == 3 and bits == 32:
        x = np.frombuffer(raw, "<f4").astype(np.float32)
    elif tag == 1 and bits == 8:
        x = np.frombuffer(raw, np.uint8).astype(np.float32) * np.float32(0.00784313725490196078) - np.float32(1)
    elif tag == 1 and bits == 16:
        x = np.frombuffer(raw, "<i2").astype(np.float32) * np.float32(0.000030517578125)
    elif tag == 1 and bits == 24:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = ((b[:, 0] << 8) | (b[:, 1] << 16) | (b[:, 2] << 24)) >> 8
        x = v.astype(np.float32) * np.float32(0.00000011920928955078125)
    elif tag == 1 and bits == 32:
        x = (np.frombuffer(raw, "<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    else:
        raise MediaError("Unable to read WAV audio file from buffer")
    x = x.reshape(-1, channels)
    x = x[:, 0] if channels == 1 else (x.sum(axis=1, dtype=np.float32) * np.float32(1.0 / channels))
    if src_rate != rate:
        t = np.arange(int(len(x) * rate / src_rate)) * (src_rate / rate)
        x = np.interp(t, np.arange(len(x)), x).astype(np.float32)
    return x.astype(np.float32)


def _mel_filters(n_mel: int, n_fft: int, sr: int) -> np.ndarray:
    """fill_mel_filterbank_matrix: [n_mel, n_fft / 2 + 1] Slaney-scale triangles, area-normalized."""
    min_log_hz, lin_slope = 1000.0, 3 / 200.0
    min_log_mel, log_step = min_log_hz * lin_slope, math.log(6.4) / 27.0

    def hz_to_mel(f):
        return f * lin_slope if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / log_step

    def mel_to_hz(m):
        return m / lin_slope if m < min_log_mel else min_log_hz * math.exp((m - min_log_mel) * log_step)
    lo, hi = hz_to_mel(0.0), hz_to_mel(0.5 * sr)
    hz = [mel_to_hz(lo + (hi - lo) * (i / (n_mel + 1))) for i in range(n_mel + 2)]
    bins = n_fft // 2 + 1
    f = np.arange(bins) * (sr / n_fft)
    out = np.zeros((n_mel, bins), dtype=np.float64)
    for m in range(n_mel):
        left, center, right = hz[m], hz[m + 1], hz[m + 2]
        w = np.where((f >= left) & (f <= center), (f - left) / max(1e-30, center - left),
                     np.where((f > center) & (f <= right), (right - f) / max(1e-30, right - center), 0.0))
        out[m] = w * (2.0 / max(1e-30, right - left))
    return out.astype(np.float32)


def log_mel(n_mel: int, samples: np.ndarray) -> list[np.ndarray]:
    """Whisper log-mel chunks [n_mel, 3000] float32 of mono 16 kHz samples (module docstring)."""
    x = samples.astype(np.float32)
    if len(x) < N_FFT // 2 + 1:  # reflection padding needs one sample plus half a window
        x = np.concatenate([x, np.zeros(N_FFT // 2 + 1 - len(x), np.float32)])
    pad = N_FFT // 2
    padded = np.zeros(len(x) + SAMPLE_RATE * 30 + 2 * pad, dtype=np.float32)
    padded[pad:pad + len(x)] = x
    padded[:pad] = x[1:pad + 1][::-1]
    n_len = (len(padded) - N_FFT) // HOP + 1
    window = (0.5 * (1.0 - np.cos(2.0 * math.pi * np.arange(N_FFT) / N_FFT))).astype(np.float32)
    n_valid = min(len(padded) // HOP + 1, n_len)
    idx = np.arange(n_valid)[:, None] * HOP + np.arange(N_FFT)[None, :]
    frames = padded[np.minimum(idx, len(padded) - 1)] * (idx < len(padded)) * window
    spec = np.fft.rfft(frames.astype(np.float64), axis=1)
    power = (spec.real ** 2 + spec.imag ** 2).astype(np.float32)
    mel = power.astype(np.float64) @ _mel_filters(n_mel, N_FFT, SAMPLE_RATE).astype(np.float64).T
    out = np.full((n_len, n_mel), math.log10(1e-10))
    out[:n_valid] = np.log10(np.maximum(mel, 5.960464477539063e-08))
    out = out.astype(np.float32).T  # [n_mel, n_len]
    floor = np.float32(float(out.max()) - 8.0)
    out = (np.maximum(out, floor) + np.float32(4.0)) / np.float32(4.0)
    return [out[:, a:a + CHUNK_FRAMES].copy() for a in range(0, n_len - CHUNK_FRAMES + 1, CHUNK_FRAMES)]


def audio_chunks(audio: "AudioEncoder", samples: np.ndarray, fid: str) -> list:
    """The media chunks of one audio clip (`decode_wav`'s samples; one chunk per 30 s), their
    tokens 1-D positions."""
    from runtime.vision.media import MediaChunk, MediaKind

    mels = log_mel(audio.cfg.n_mel_bins, samples)
    if not mels:
        raise MediaTokenizeError("Unable to preprocess audio")
    n = CHUNK_FRAMES // 4  # conv stride 2, then the average pool of 2
    return [MediaChunk(0, n, n, MediaKind.AUDIO, fid, data=m) for m in mels]


class AudioEncoder:
    """The Qwen2-Audio encoder of an mmproj file (projector `qwen2a`, or `qwen2.5o`'s audio half)."""

    def __init__(self, mm: MmprojFile, device: str | torch.device = "cpu", backend: str | None = None):
        self.cfg: ClipConfig = mm.audio
        self.device = torch.device(device)
        self.ops = kernels.Backend.for_device(self.device, backend)
        self.w: dict[str, object] = {}
        for name, t in mm.weights.items():
            if not (name.startswith("a.") or name.startswith("mm.a.")):
                continue
            t = t.to(self.device)
            if isinstance(t, QWeight):
                if name.startswith("a.conv1d.") or name == "a.position_embd.weight":
                    t = kernels.dequantize(t)
                    if name.endswith(".bias"):  # [1, C] in GGML
                        t = t.reshape(-1)
                    elif name.startswith("a.conv1d."):
                        self.w[name + ".qtype"] = FLOAT_TYPES.get(mm.weights[name].qtype)
                else:
                    t = self.ops.prepare_weight(t, False, False)
            self.w[name] = t

    def _mm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        w = self.w[name + ".weight"]
        dt = FLOAT_TYPES.get(w.qtype)
        xi = x.to(dt).float() if dt in (torch.float16, torch.bfloat16) else x
        y = self.ops.qmatmul(xi.contiguous(), w)
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def _conv(self, x: torch.Tensor, i: int, stride: int) -> torch.Tensor:
        """ggml_conv_1d_ph (kernel 3, padding 1) as im2col in the kernel's type and a matmul: x [C_in, L]."""
        w = self.w[f"a.conv1d.{i}.weight"]  # [C_out * C_in, 3] rows of the GGML [3, C_in, C_out]
        c_in = x.shape[0]
        c_out = w.shape[0] // c_in
        k = w.reshape(c_out, c_in * 3)
        xp = torch.nn.functional.pad(x, (1, 1))
        n_out = (x.shape[1] + 2 - 3) // stride + 1
        idx = torch.arange(n_out, device=x.device)[:, None] * stride + torch.arange(3, device=x.device)[None, :]
        cols = xp[:, idx].permute(1, 0, 2).reshape(n_out, c_in * 3)  # [L_out, (c_in, 3)]
        dt = self.w.get(f"a.conv1d.{i}.weight.qtype")
        if dt in (torch.float16, torch.bfloat16):
            cols, k = cols.to(dt).float(), k.to(dt).float()
        y = self.ops.qmatmul(cols.contiguous(), QWeight.from_float(k.contiguous()))
        y = y + self.w[f"a.conv1d.{i}.bias"]
        return _gelu_erf(y).t()  # [C_out, L_out]

    def encode(self, mel: np.ndarray) -> torch.Tensor:
        c = self.cfg
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32)).to(self.device)
            x = self._conv(x, 1, 1)
            x = self._conv(x, 2, 2).t().contiguous()  # [n_pos, C]
            x = x + self.w["a.position_embd.weight"][:x.shape[0]]
            H, d = c.n_head, c.n_embd // c.n_head
            for il in range(c.n_layer):
                p = f"a.blk.{il}."
                h = self.ops.layer_norm(x, self.w[p + "ln1.weight"], self.w.get(p + "ln1.bias"), c.eps)
                n = h.shape[0]
                q = self._mm(h, p + "attn_q").reshape(n, H, d)
                k = self._mm(h, p + "attn_k").reshape(n, H, d)
                v = self._mm(h, p + "attn_v").reshape(n, H, d)
                a = self.ops.dense_attention(q.half(), k.half(), v.half(), 1.0 / math.sqrt(d)).float()
                x = x + self._mm(a.reshape(n, H * d), p + "attn_out")
                h = self.ops.layer_norm(x, self.w[p + "ln2.weight"], self.w.get(p + "ln2.bias"), c.eps)
                x = x + self._mm(_gelu_erf(self._mm(h, p + "ffn_up")), p + "ffn_down")
            x = x[:x.shape[0] // 2 * 2].reshape(-1, 2, x.shape[1]).mean(dim=1)  # AvgPool1d(2, 2)
            x = self.ops.layer_norm(x, self.w["a.post_ln.weight"], self.w.get("a.post_ln.bias"), c.eps)
            return self._mm(x, "mm.a.fc").float()


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))

"""The vision encoders of llama.cpp b1-0c1e570's tools/mtmd for Gemma 3 (SigLIP ViT + average pool,
RMSNorm and projection: models/siglip.cpp) and Qwen2-VL / Qwen2.5-VL / Qwen3-VL (patch pairs of
both temporal kernels, 2x2 patch merge, 2-D vision RoPE, Qwen2.5's window attention, Qwen3's
learned position embeddings and deepstack features: models/qwen2vl.cpp, models/qwen3vl.cpp), run
through the kernel dispatch surface (`kernels.Backend`: C / torch on the CPU, Triton on CUDA).

`VisionEncoder(mm, device).encode(pixels)`: pixels float32 [H, W, 3] as `runtime.vision.image.preprocess`
returns them -> embeddings [n_tokens, n_embd_out] float32 in the order the language model reads
them (rows of the merged patch grid).

Where ggml rounds to float16, so does this: the inputs of a matmul with float16 weights (ggml
converts src1 to the weights' vec_dot type) and the patch pixels (im2col in the kernel's type), and
q, k, v of the attention (clip.cpp runs ggml_flash_attn_ext with K and V cast to float16 when flash
attention is on, llama-server's default).
"""
from __future__ import annotations

import math

import numpy as np
import torch

import kernels
from kernels.qweight import FLOAT_TYPES, QWeight
from runtime.vision.mmproj import FfnOp, MmprojFile, ProjectorType

__all__ = ["VisionEncoder", "merge_order", "window_index", "vision_positions"]

_ROUND = {torch.float16: torch.float16, torch.bfloat16: torch.bfloat16}


def merge_order(ph: int, pw: int) -> np.ndarray:
    """Raster patch index (y * pw + x) of each token in Qwen-VL's merged order: 2x2 blocks in
    raster order, raster order inside a block (the graph's permute / reshape chain)."""
    idx = np.arange(ph * pw).reshape(ph // 2, 2, pw // 2, 2).transpose(0, 2, 1, 3)
    return idx.reshape(-1)


def vision_positions(ph: int, pw: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) of each token in merged order (clip_encode's `positions`, sections 0 and 1)."""
    order = merge_order(ph, pw)
    return order // pw, order % pw


def window_index(ph: int, pw: int, patch_size: int, window: int = 112) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's window grouping over the merged grid (ph/2 x pw/2 cells, windows of `window`
    pixels: clip.cpp's 112, whatever the file says): (idx, mask) with idx[src] = the cell's place
    once the cells of each window are made contiguous, and mask [n, n] bool (True: visible) over
    the 4 patches per cell, in that windowed order."""
    mh, mw = ph // 2, pw // 2
    grid = max(1, window // patch_size // 2)
    idx = np.zeros(mh * mw, dtype=np.int64)
    n = ph * pw
    mask = np.zeros((n, n), dtype=bool)
    dst = 0
    for y in range(0, mh, grid):
        for x in range(0, mw, grid):
            wh, ww = min(grid, mh - y), min(grid, mw - x)
            d0 = dst
            for dy in range(wh):
                for dx in range(ww):
                    idx[(y + dy) * mw + x + dx] = dst
                    dst += 1
            mask[d0 * 4:dst * 4, d0 * 4:dst * 4] = True
    return idx, mask


class VisionEncoder:
    def __init__(self, mm: MmprojFile, device: str | torch.device = "cpu", backend: str | None = None):
        cfg = mm.vision
        if cfg is None:
            raise ValueError("the mmproj file has no vision encoder")
        self.cfg = cfg
        self.device = torch.device(device)
        self.ops = kernels.Backend.for_device(self.device, backend)
        w = mm.weights
        self.w: dict[str, object] = {}
        for name, t in w.items():
            if (name.startswith("v.") or name.startswith("mm.")) and not name.startswith("mm.a."):
                self.w[name] = t.to(self.device)
        self._swap_legacy_ffn()
        p = cfg.patch_size
        for name, t in list(self.w.items()):
            if not isinstance(t, QWeight):
                continue
            if name.startswith("v.patch_embd.weight"):  # conv [n_embd, 3, p, p] as a matrix over (c, ky, kx)
                if not t.is_float:
                    raise ValueError(f"{name}: a quantized patch embedding is not supported")
                n_out = t.rows * t.cols // (3 * p * p)
                t = QWeight.from_float(t.data.reshape(n_out, 3 * p * p))
            elif name == "v.position_embd.weight":
                self.w[name] = kernels.dequantize(t)
                continue
            elif name == "mm.input_projection.weight":
                continue
            self.w[name] = self.ops.prepare_weight(t, False, False)
        if cfg.proj is ProjectorType.GEMMA3:  # used as x @ W: keep W^T as the matmul weight
            wp = self.w["mm.input_projection.weight"]
            dense = kernels.dequantize(wp).t().contiguous()
            dt = wp.data.dtype if wp.is_float else torch.float32
            self.w["mm.input_projection.weight"] = self.ops.prepare_weight(QWeight.from_float(dense.to(dt)), False, False)
        self.n_deepstack = sum(1 for i in range(cfg.n_layer) if f"v.deepstack.{i}.fc1.weight" in self.w)

    def _swap_legacy_ffn(self) -> None:
        """clip.cpp's fix for files whose ffn_up / ffn_down names are swapped (old conversions)."""
        for i in range(self.cfg.n_layer):
            up, down = f"v.blk.{i}.ffn_up.", f"v.blk.{i}.ffn_down."
            wd = self.w.get(down + "weight")
            if self.w.get(up + "weight") is not None and isinstance(wd, QWeight) and wd.cols == self.cfg.n_embd:
                for s in ("weight", "bias"):
                    a, b = self.w.pop(up + s, None), self.w.pop(down + s, None)
                    if b is not None:
                        self.w[up + s] = b
                    if a is not None:
                        self.w[down + s] = a

    # ---- ops ---------------------------------------------------------------------------------

    def _mm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W^T (+ bias): activations rounded to the weights' float type first, as ggml does."""
        w = self.w[name + ".weight"]
        rt = _ROUND.get(FLOAT_TYPES.get(w.qtype))
        xi = x.to(rt).float() if rt is not None else x
        y = self.ops.qmatmul(xi.contiguous(), w)
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def _norm(self, x: torch.Tensor, name: str, rms: bool) -> torch.Tensor:
        w, b = self.w.get(name + ".weight"), self.w.get(name + ".bias")
        if rms:
            y = self.ops.rms_norm(x, torch.ones_like(x[0]) if w is None else w, self.cfg.eps)
            return y if b is None else y + b
        return self.ops.layer_norm(x, w, b, self.cfg.eps)

    def _act(self, x: torch.Tensor, op: FfnOp, gate: torch.Tensor | None = None) -> torch.Tensor:
        up = gate if gate is not None else torch.ones_like(x)
        if op is FfnOp.GELU:
            return self.ops.gelu_mul(x, up)
        if op is FfnOp.SILU:
            return self.ops.silu_mul(x, up)
        if op is FfnOp.GELU_ERF:
            return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0)))) * up
        return x * torch.sigmoid(1.702 * x) * up  # GELU_QUICK

    def _ffn(self, x: torch.Tensor, up: str, gate: str | None, down: str, op: FfnOp) -> torch.Tensor:
        """build_ffn: parallel gate (when present) and up, the activation, down."""
        u = self._mm(x, up)
        if gate is not None and gate + ".weight" in self.w:
            h = self._act(self._mm(x, gate), op, u)
        else:
            h = self._act(u, op)
        return self._mm(h, down)

    def _attend(self, q, k, v, mask) -> torch.Tensor:
        """[n, H, d] each -> [n, H * d]: flash attention with q, k, v in float16 (clip.cpp's graph)."""
        n, H, d = q.shape
        o = self.ops.dense_attention(q.half(), k.half(), v.half(), 1.0 / math.sqrt(d), mask)
        return o.float().reshape(n, H * d)

    def _rope2d(self, x: torch.Tensor, pos_y: torch.Tensor, pos_x: torch.Tensor) -> torch.Tensor:
        """ggml_rope_multi in GGML_ROPE_TYPE_VISION mode with sections d/4 x 4: pairs (i, i + d/2);
        the first d/4 pairs turn with the row, the next d/4 with the column, each section's angles
        chained from its own start (base 10000, n_dims d/2)."""
        n, H, d = x.shape
        q4 = d // 4
        ts = float(np.power(np.float32(10000.0), np.float32(-2.0) / np.float32(d // 2), dtype=np.float32))
        inv = torch.tensor([ts ** i for i in range(q4)], dtype=torch.float32, device=x.device)
        out = x.clone()
        for sec, pos in ((0, pos_y), (1, pos_x)):
            lo, hi = sec * q4, (sec + 1) * q4
            part = torch.cat([x[..., lo:hi], x[..., d // 2 + lo:d // 2 + hi]], dim=-1)
            r = self.ops.rope(part.contiguous(), pos, inv, True, ts)
            out[..., lo:hi], out[..., d // 2 + lo:d // 2 + hi] = r[..., :q4], r[..., q4:]
        return out

    # ---- graphs ------------------------------------------------------------------------------

    def _patches(self, img: torch.Tensor, name: str) -> torch.Tensor:
        """ggml_conv_2d(kernel, image, stride p): [ph * pw, n_embd] in raster order (im2col in the
        kernel's type, then the matmul)."""
        p = self.cfg.patch_size
        H, W, _ = img.shape
        ph, pw = H // p, W // p
        x = img[:ph * p, :pw * p].permute(2, 0, 1)  # [3, H, W]
        cols = x.reshape(3, ph, p, pw, p).permute(1, 3, 0, 2, 4).reshape(ph * pw, 3 * p * p)
        w = self.w[name]
        rt = _ROUND.get(FLOAT_TYPES.get(w.qtype))
        cols = cols.to(rt).float() if rt is not None else cols
        return self.ops.qmatmul(cols.contiguous(), w)

    def encode(self, pixels: np.ndarray) -> torch.Tensor:
        img = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)).to(self.device)
        with torch.inference_mode():
            if self.cfg.proj is ProjectorType.GEMMA3:
                return self._gemma3(img)
            return self._qwen(img)

    def _layer(self, x, il: int, rms: bool, mask=None, pos=None) -> torch.Tensor:
        c = self.cfg
        p = f"v.blk.{il}."
        n = x.shape[0]
        H, d = c.n_head, c.d_head
        h = self._norm(x, p + "ln1", rms)
        if p + "attn_qkv.weight" in self.w:
            qkv = self._mm(h, p + "attn_qkv")
            q, k, v = qkv[:, :H * d], qkv[:, H * d:2 * H * d], qkv[:, 2 * H * d:]
        else:
            q, k, v = self._mm(h, p + "attn_q"), self._mm(h, p + "attn_k"), self._mm(h, p + "attn_v")
        q, k, v = q.reshape(n, H, d), k.reshape(n, H, d), v.reshape(n, H, d)
        if pos is not None:
            q, k = self._rope2d(q, *pos), self._rope2d(k, *pos)
        a = self._mm(self._attend(q, k, v, mask), p + "attn_out")
        x = a + x
        h = self._norm(x, p + "ln2", rms)
        return x + self._ffn(h, p + "ffn_up", p + "ffn_gate", p + "ffn_down", c.ffn_op)

    def _gemma3(self, img: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        x = self._patches(img, "v.patch_embd.weight")
        if "v.patch_embd.bias" in self.w:
            x = x + self.w["v.patch_embd.bias"]
        x = x + self.w["v.position_embd.weight"]
        if "v.pre_ln.weight" in self.w:
            x = self._norm(x, "v.pre_ln", False)
        for il in range(c.n_layer):
            x = self._layer(x, il, rms=False)
        if "v.post_ln.weight" in self.w:
            x = self._norm(x, "v.post_ln", False)
        side = int(math.isqrt(x.shape[0]))
        k = c.n_merge
        m = side // k
        x = x[:].reshape(side, side, -1)[:m * k, :m * k].reshape(m, k, m, k, -1).mean(dim=(1, 3)).reshape(m * m, -1)
        x = self.ops.rms_norm(x.contiguous(), self.w["mm.soft_emb_norm.weight"], c.eps)
        return self._mm(x, "mm.input_projection").float()

    def _qwen(self, img: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        p = c.patch_size
        ph, pw = img.shape[0] // p, img.shape[1] // p
        x = self._patches(img, "v.patch_embd.weight")
        if "v.patch_embd.weight.1" in self.w:
            x = x + self._patches(img, "v.patch_embd.weight.1")
        order = torch.from_numpy(merge_order(ph, pw)).to(self.device)
        x = x[order]
        if "v.patch_embd.bias" in self.w:
            x = x + self.w["v.patch_embd.bias"]
        if c.proj is ProjectorType.QWEN3VL:
            x = x + self._resized_pos_embd(ph, pw)[order]
        ys, xs = vision_positions(ph, pw)
        rms = c.proj is ProjectorType.QWEN25VL
        n = ph * pw
        mask = None
        windowed = c.proj is ProjectorType.QWEN25VL and c.n_wa_pattern > 0
        if windowed:
            idx, wmask = window_index(ph, pw, p)
            inv = np.argsort(idx)
            rows = (inv[:, None] * 4 + np.arange(4)[None, :]).reshape(-1)
            rows_t = torch.from_numpy(rows).to(self.device)
            x = x[rows_t]
            ys, xs = ys[rows], xs[rows]
            mask = torch.from_numpy(wmask).to(self.device)
        pos = (torch.from_numpy(ys).to(self.device), torch.from_numpy(xs).to(self.device))
        if "v.pre_ln.weight" in self.w:
            x = self._norm(x, "v.pre_ln", rms)
        deep: list[torch.Tensor] = []
        for il in range(c.n_layer):
            full = not windowed or (il + 1) % c.n_wa_pattern == 0
            x = self._layer(x, il, rms, None if full else mask, pos)
            if f"v.deepstack.{il}.fc1.weight" in self.w:
                f = self._norm(x.reshape(n // 4, -1), f"v.deepstack.{il}.norm", False)
                deep.append(self._ffn(f, f"v.deepstack.{il}.fc1", None, f"v.deepstack.{il}.fc2", FfnOp.GELU))
        if "v.post_ln.weight" in self.w:
            x = self._norm(x, "v.post_ln", rms)
        out = self._ffn(x.reshape(n // 4, -1), "mm.0", None, "mm.2", FfnOp.GELU)
        if windowed:
            out = out[torch.from_numpy(idx).to(self.device)]
        if deep:
            out = torch.cat([out, *deep], dim=1)
        return out.float()

    def _resized_pos_embd(self, ph: int, pw: int) -> torch.Tensor:
        """Qwen3-VL's learned position embeddings on the image's patch grid: ggml_interpolate,
        bilinear with aligned corners, in raster order [ph * pw, n_embd]."""
        pe = self.w["v.position_embd.weight"]
        side = int(math.isqrt(pe.shape[0]))
        if side == ph and side == pw:
            return pe.float()
        grid = pe.float().reshape(side, side, -1)  # [y, x, C]
        f = np.float32

        def coords(n_out: int, n_in: int):
            sf = f(n_out - 1) / f(n_in - 1) if n_out > 1 and n_in > 1 else f(n_out) / f(n_in)
            pos = np.arange(n_out, dtype=np.float32) / sf
            i0 = np.floor(pos).astype(np.int64)
            i1 = np.clip(i0 + 1, 0, n_in - 1)
            i0 = np.clip(i0, 0, n_in - 1)
            dd = np.clip(pos - i0.astype(np.float32), 0.0, 1.0).astype(np.float32)
            return i0, i1, dd

        y0, y1, dy = coords(ph, side)
        x0, x1, dx = coords(pw, side)
        t = lambda a: torch.from_numpy(a).to(grid.device)  # noqa: E731
        dy_t, dx_t = t(dy)[:, None, None], t(dx)[None, :, None]
        a = grid[t(y0)][:, t(x0)]
        b = grid[t(y0)][:, t(x1)]
        cc = grid[t(y1)][:, t(x0)]
        d = grid[t(y1)][:, t(x1)]
        val = a * (1 - dx_t) * (1 - dy_t) + b * dx_t * (1 - dy_t) + cc * (1 - dx_t) * dy_t + d * dx_t * dy_t
        return val.reshape(ph * pw, -1)

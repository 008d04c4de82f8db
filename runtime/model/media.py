"""Prompt rows that are media embeddings (an image's or an audio clip's) instead of tokens, as
llama.cpp b1-0c1e570 decodes them (mtmd_helper_decode_image_chunk): the rows of a media chunk
take the encoder's output as their input embeddings (no embedding scale: gemma3 scales token rows
only), M-RoPE models give them mtmd's 2-D grid positions (t = the chunk's start, h = t + row,
w = t + column, e = 0), and a chunk that mtmd decodes with non-causal attention (Gemma 3's images)
lets each of its rows see every row of the chunk (and, on sliding-window layers, the keys within
the window of the row's own position: llama.cpp's mask with causal_attn off).

`EmbdSpan` (on `runtime.model.decoder.SeqBatch.embd`) says which rows of a sequence's new tokens
are such rows; `StepMedia` is a forward's view of them (`step_media`), which the decoder's layers
read: `put_embeddings`, `deepstack` rows, `bidirectional_attention`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["EmbdSpan", "StepMedia", "step_media", "put_embeddings", "bidirectional_attention"]


@dataclass
class EmbdSpan:
    start: int  # first row among the SeqBatch's new tokens
    n: int  # rows
    embd: torch.Tensor  # [N, n_embd_inp] float32: the whole chunk's embeddings
    offset: int = 0  # index in `embd` (and in the chunk) of the span's first row
    nx: int = 0  # M-RoPE grid width of an image (0: the chunk's positions run 1-D)
    bidirectional: bool = False  # the chunk's rows see every row of the chunk
    kv_end: int = 0  # bidirectional: KV index one past the chunk's last row


@dataclass
class StepMedia:
    rows: torch.Tensor  # [R] int64: the step's token rows that take embeddings
    embd: torch.Tensor  # [R, n_embd_inp] float32
    pos4: torch.Tensor | None = None  # [4, T] int64 M-RoPE positions (None: the plain positions)
    # (first row, end row, sequence index, keys visible to the rows, in KV order) of bidirectional spans
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)

    def to(self, device) -> "StepMedia":
        return StepMedia(self.rows.to(device), self.embd.to(device),
                         None if self.pos4 is None else self.pos4.to(device), self.spans)


def step_media(batch, pos: torch.Tensor, mrope: bool) -> StepMedia | None:
    """The media rows of a forward's batch (`SeqBatch`es in order; pos [T]: each row's rope
    position), or None when it has none."""
    if not any(b.embd for b in batch):
        return None
    rows, embd, spans = [], [], []
    pos4 = pos[None, :].repeat(4, 1) if mrope else None
    if pos4 is not None:
        pos4[3] = 0  # llama.cpp gives every row a 4th position of 0 (text tokens too)
    r0 = 0
    for si, b in enumerate(batch):
        for sp in b.embd:
            a = r0 + sp.start
            idx = torch.arange(sp.offset, sp.offset + sp.n)
            rows.append(torch.arange(a, a + sp.n))
            embd.append(sp.embd[sp.offset:sp.offset + sp.n].float())
            if pos4 is not None:
                t = pos[a:a + sp.n]
                if sp.nx > 0:
                    pos4[1, a:a + sp.n] = t + idx // sp.nx
                    pos4[2, a:a + sp.n] = t + idx % sp.nx
            if sp.bidirectional:
                spans.append((a, a + sp.n, si, min(sp.kv_end, b.n_past + len(b.tokens))))
        r0 += len(b.tokens)
    return StepMedia(torch.cat(rows), torch.cat(embd).to(embd[0].device), pos4, spans)


def slice_spans(spans: tuple, a: int, e: int) -> tuple:
    """The spans of rows a..e-1 of a SeqBatch, for the SeqBatch of those rows alone."""
    out = []
    for sp in spans:
        lo, hi = max(a, sp.start), min(e, sp.start + sp.n)
        if lo < hi:
            out.append(EmbdSpan(lo - a, hi - lo, sp.embd, sp.offset + lo - sp.start, sp.nx, sp.bidirectional,
                                sp.kv_end))
    return tuple(out)


def put_embeddings(h: torch.Tensor, media: StepMedia, n_embd: int) -> torch.Tensor:
    """The residual stream's input h [T, C] with the media rows' embeddings in place."""
    h = h.clone()
    h[media.rows] = media.embd[:, :n_embd].to(h.dtype)
    return h


def deepstack_rows(media: StepMedia, layer: int, n_embd: int) -> torch.Tensor:
    """[R, C]: what qwen3vl adds to the media rows after `layer` (its column block layer + 1)."""
    return media.embd[:, (layer + 1) * n_embd:(layer + 2) * n_embd]


def bidirectional_attention(ops, attn: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            tables: torch.Tensor, cu: torch.Tensor, kv_lens: torch.Tensor, media: StepMedia,
                            scale: float, softcap: float, window: int, k_type=None, v_type=None) -> torch.Tensor:
    """attn [T, H, D] with the rows of bidirectional spans recomputed: each such row (KV index p)
    sees the keys 0 .. kv_end - 1 of its sequence (only those above p - window on a sliding-window
    layer), read from the paged cache through the sequence's block table (a quantized cache,
    `k_type` / `v_type`: dequantized)."""
    import kernels

    NB, BS, KVH, _ = k_cache.shape
    cu_h, lens_h = cu.tolist(), kv_lens.tolist()
    for a, e, si, kv_end in media.spans:
        blocks = tables[si, :(kv_end + BS - 1) // BS].long()
        k = k_cache[blocks].reshape(-1, KVH, k_cache.shape[3])[:kv_end]
        v = v_cache[blocks].reshape(-1, KVH, v_cache.shape[3])[:kv_end]
        k = kernels.dequantize_kv(k, k_type) if k_type is not None else k
        v = kernels.dequantize_kv(v, v_type) if v_type is not None else v
        p0 = lens_h[si] - (cu_h[si + 1] - cu_h[si]) + (a - cu_h[si])  # KV index of row a
        mask = None
        if window > 0:
            p = torch.arange(p0, p0 + e - a, device=q.device)
            mask = torch.arange(kv_end, device=q.device)[None, :] > (p[:, None] - window)
        attn[a:e] = ops.dense_attention(q[a:e], k, v, scale, mask, softcap).to(attn.dtype)
    return attn

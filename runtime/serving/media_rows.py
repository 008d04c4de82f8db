"""A request's media chunks in the engine: where its prompt batches may end, which rows of a batch
take media embeddings, and the rope positions of its tokens, as llama-server b1-0c1e570 decodes
a prompt with media (server-context.cpp update_slots + mtmd_helper_decode_image_chunk):

- a batch of prompt text stops before a media chunk; a media chunk is decoded alone and whole
  (`cut`);
- a cached prefix never ends inside a chunk (`align`: server_tokens keeps whole chunks);
- positions (`pos`): a chunk takes `n_pos` positions for its `n_tokens` rows (M-RoPE images:
  max(nx, ny)), so every token after it sits `n_tokens - n_pos` earlier than its KV index;
- the chunk's embeddings are computed once, when its first row is planned (`rows`), and kept with
  the request.
"""
from __future__ import annotations

import bisect
from typing import Callable

import torch

from runtime.model.media import EmbdSpan
from runtime.vision.media import MediaChunk

__all__ = ["PromptMedia"]


class PromptMedia:
    def __init__(self, chunks: list[MediaChunk]):
        self.chunks = sorted(chunks, key=lambda c: c.start)
        self._starts = [c.start for c in self.chunks]
        self.embd: dict[int, torch.Tensor] = {}  # chunk start -> [n_tokens, n_embd_inp]
        self.total_shift = sum(c.n_tokens - c.n_pos for c in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def touches(self, start: int) -> bool:
        """Whether a prompt batch starting at `start` is a media chunk or the text right after one:
        llama-server saves no context checkpoint before those ("do not checkpoint after mtmd chunks")."""
        return self._containing(start) is not None or (start > 0 and self._containing(start - 1) is not None)

    def _containing(self, i: int) -> MediaChunk | None:
        k = bisect.bisect_right(self._starts, i) - 1
        return self.chunks[k] if k >= 0 and i < self.chunks[k].end else None

    def align(self, n: int) -> int:
        """A cached prefix of n tokens cut back to the start of a chunk it would end inside."""
        c = self._containing(n - 1) if n > 0 else None
        return c.start if c is not None and n < c.end else n

    def cut(self, a: int, n: int) -> int:
        """How many prompt rows from `a` one batch takes when it would take n: a whole chunk when
        one starts at a, else at most up to the next chunk's start."""
        c = self._containing(a)
        if c is not None:
            return c.end - a
        k = bisect.bisect_right(self._starts, a)
        if k < len(self.chunks):
            n = min(n, self.chunks[k].start - a)
        return n

    def shift(self, i: int) -> int:
        """KV index minus rope position of token i (the chunks wholly before it)."""
        s = 0
        for c in self.chunks:
            if c.end > i:
                break
            s += c.n_tokens - c.n_pos
        return s

    def positions(self, a: int, e: int) -> list[int] | None:
        """Rope positions of prompt tokens a..e-1 (a chunk's tokens: its first position, or a run of
        n_tokens when it is 1-D); None when they equal the KV indices."""
        if self.shift(e) == 0:
            return None
        out = []
        for i in range(a, e):
            c = self._containing(i)
            if c is not None and c.nx > 0:
                out.append(c.start - self.shift(c.start))
            else:
                out.append(i - self.shift(i))
        return out

    def rows(self, a: int, e: int, encode: Callable[[MediaChunk], torch.Tensor]) -> tuple[EmbdSpan, ...]:
        """The embedding rows among prompt tokens a..e-1 (each chunk encoded on first use)."""
        spans = []
        for c in self.chunks:
            lo, hi = max(a, c.start), min(e, c.end)
            if lo >= hi:
                continue
            emb = self.embd.get(c.start)
            if emb is None:
                emb = self.embd[c.start] = encode(c)
            spans.append(EmbdSpan(lo - a, hi - lo, emb, lo - c.start, c.nx, c.bidirectional, c.end))
        return tuple(spans)

"""Slot-side policies of the scheduler, as pure functions and small data structures:

- `common_prefix` and `cache_reuse_plan` (llama.cpp's `--cache-reuse` chunk walk),
- `PromptCache`: the host-RAM prompt cache (`--cache-ram`) of saved slot states,
- `TextState`: detokenized text of a generation with UTF-8 completion and stop strings,
- slot files (`/slots/{id}?action=save|restore`) in llama.cpp's sequence-state layout.

The engine (`runtime/engine.py`) owns the instances and calls these from its loop thread.
"""
from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass, field

import numpy as np
import torch


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.nonzero(x != y)[0]
    return int(diff[0]) if diff.size else n


def cache_reuse_plan(cache: list[int], prompt: list[int], n_past: int, n_reuse: int) -> tuple[list[tuple[int, int, int]], int]:
    """llama.cpp's reuse loop: walk the cached tokens after the common prefix and move every run of
    at least `n_reuse` tokens that matches the prompt at the current position to that position.
    Returns ([(src, dst, n), ...], new n_past)."""
    moves = []
    head_c = head_p = n_past
    while head_c < len(cache) and head_p < len(prompt):
        n = 0
        while head_c + n < len(cache) and head_p + n < len(prompt) and cache[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= n_reuse:
            if head_c != head_p:
                moves.append((head_c, head_p, n))
            n_past += n
            head_c += n
            head_p += n
        else:
            head_c += 1
    return moves, n_past


# ---- host-RAM prompt cache -------------------------------------------------------------------

@dataclass
class CacheEntry:
    tokens: list[int]
    state: dict  # {"k": [L, n, KVH, D], "v": ...} on the host
    size: int


@dataclass
class PromptCache:
    """Saved slot states, oldest first (FIFO eviction, as llama.cpp's server_prompt_cache)."""
    limit_bytes: int | None  # None = no size limit
    limit_tokens: int = 0
    entries: list[CacheEntry] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def n_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def save(self, tokens: list[int], export) -> bool:
        """Save a slot's state unless an entry already holds these tokens as a prefix; entries
        that the new one fully contains are dropped."""
        for e in self.entries:
            if len(e.tokens) >= len(tokens) and e.tokens[: len(tokens)] == tokens:
                return False
        self.entries = [e for e in self.entries
                        if not (len(e.tokens) <= len(tokens) and tokens[: len(e.tokens)] == e.tokens)]
        state = export()
        size = sum(t.numel() * t.element_size() for t in state.values())
        self.entries.append(CacheEntry(list(tokens), state, size))
        return True

    def take_best(self, cur: list[int], new: list[int]) -> CacheEntry | None:
        """Remove and return the entry that keeps more of itself and covers more of `new` than the
        slot's current content does (entries keeping < 25% of themselves are never used)."""
        if not new:
            return None
        lcp = common_prefix(cur, new)
        f_keep_best = lcp / len(cur) if cur else -1.0
        sim_best = lcp / len(new)
        best = None
        for e in self.entries:
            lcp_cur = common_prefix(e.tokens, new)
            f_keep = lcp_cur / len(e.tokens)
            sim = lcp_cur / len(new)
            if f_keep < 0.25:
                continue
            if f_keep_best < f_keep and sim_best < sim:
                f_keep_best, sim_best, best = f_keep, sim, e
        if best is not None:
            self.entries.remove(best)
        return best

    def update(self) -> None:
        """Evict oldest entries over the size limit or the token limit (always keep one)."""
        if self.limit_bytes is not None:
            while len(self.entries) > 1 and self.size > self.limit_bytes:
                self.entries.pop(0)
        limit_tokens = self.limit_tokens
        if self.limit_bytes and self.entries:
            per_tok = max(1, self.size // max(self.n_tokens, 1))
            limit_tokens = max(limit_tokens, self.limit_bytes // per_tok)
        if limit_tokens > 0:
            while len(self.entries) > 1 and self.n_tokens > limit_tokens:
                self.entries.pop(0)


# ---- generated text: UTF-8 completion and stop strings ------------------------------------

class TextState:
    """Accumulates token pieces into text, holding back incomplete UTF-8 sequences and text that
    may be the start of a stop string (as llama.cpp's process_token does)."""

    def __init__(self, stop: list[str], tokenizer=None):
        self.stop = [w for w in (stop or []) if w]
        self.text = ""
        self.n_sent = 0
        self.stopping_word = ""
        self.has_new_line = False
        self._last_nl = 0  # start of the line after the last newline seen by indent_stop
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, piece: bytes, is_eog: bool = False) -> tuple[str | None, str]:
        """Add one token's bytes; returns (stop word if one completed, text to send now)."""
        new = self._dec.decode(piece)
        self.text += new
        if "\n" in new:
            self.has_new_line = True
        if self._dec.getstate()[0]:
            return None, ""  # incomplete UTF-8 character at the end
        pos = self.n_sent
        tail = self.text[pos:]
        # a complete stop string: cut the text there
        best = None
        for w in self.stop:
            start = max(0, len(tail) - len(new) - len(w))
            i = tail.find(w, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, w)
        if best is not None:
            self.text = self.text[: pos + best[0]]
            self.stopping_word = best[1]
            delta = self.text[self.n_sent:]
            self.n_sent = len(self.text)
            return best[1], delta
        # a partial stop string at the end: hold the text back
        if not is_eog:
            for w in self.stop:
                for k in range(min(len(w) - 1, len(tail)), 0, -1):
                    if tail.endswith(w[:k]):
                        return None, ""
        delta = self.text[self.n_sent:]
        self.n_sent = len(self.text)
        return None, delta

    def indent_stop(self, n_indent: int) -> bool:
        """llama.cpp's `n_indent` rule: once a line has started after a newline, stop (and cut the
        line's text) when its indentation is shorter than `n_indent`."""
        if n_indent <= 0 or not self.has_new_line:
            return False
        if self._last_nl > 0:
            pos = self._last_nl
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos < len(self.text) and pos - self._last_nl < n_indent:
                self.text = self.text[:pos]
                self.n_sent = min(self.n_sent, len(self.text))
                return True
        nl = self.text.find("\n", self._last_nl)
        if nl >= 0:
            self._last_nl = nl + 1
        return False

    def final(self) -> str:
        rest = self._dec.decode(b"", final=True)
        if rest and not self.stopping_word:
            self.text += rest
        return self.text


# ---- slot files --------------------------------------------------------------------------------

SEQ_MAGIC = 0x67677371  # 'ggsq', llama.cpp's LLAMA_STATE_SEQ_MAGIC
SEQ_VERSION = 3  # LLAMA_STATE_SEQ_VERSION of b1-0c1e570
TOKENS_NULL = -1  # LLAMA_TOKEN_NULL: marks a packed server_tokens state instead of a plain token list
TOKENS_STATE_VERSION = 1  # SERVER_TOKENS_STATE_VERSION
GGML_TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}


class SlotFileError(ValueError):
    pass


def write_slot_file(path: str, tokens: list[int], state: dict, seq_id: int = 0, n_stream: int = 1) -> int:
    """A slot file as llama-server b1-0c1e570 writes it (checked byte for byte against its output):
    header (magic, version, word count), the slot's tokens packed as server_tokens::serialize does
    (LLAMA_TOKEN_NULL, state version, token count, ids, media count 0), then the KV section of
    llama_kv_cache::state_write: n_stream, and per stream a cell count; the sequence's own stream
    (stream seq_id when every slot has its own, else 0) holds per-cell (pos, n_seq_id, seq_id),
    v_trans, n_layer, per layer K (type, row bytes, rows), per layer V. Returns the bytes written."""
    k, v = state["k"], state["v"]  # [L, n, KVH, D]
    n_layer, n = k.shape[0], k.shape[1]
    packed = [TOKENS_NULL, TOKENS_STATE_VERSION, len(tokens), *tokens, 0]
    parts = [struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, len(packed)), np.asarray(packed, dtype=np.int32).tobytes(),
             struct.pack("<I", n_stream)]
    own = seq_id if n_stream > 1 else 0
    for stream in range(n_stream):
        if stream != own:
            parts.append(struct.pack("<I", 0))
            continue
        parts.append(struct.pack("<I", n))
        if n == 0:
            continue
        cells = np.zeros((n, 3), dtype=np.int32)
        cells[:, 0] = np.arange(n)
        cells[:, 1] = 1
        cells[:, 2] = seq_id
        parts.append(cells.tobytes())
        parts.append(struct.pack("<II", 0, n_layer))
        for t in (k, v):
            gtype = GGML_TYPE[t.dtype]
            for layer in range(n_layer):
                rows = t[layer].reshape(n, -1).contiguous()
                row_bytes = rows.shape[1] * rows.element_size()
                parts.append(struct.pack("<iQ", gtype, row_bytes))
                parts.append(rows.view(torch.uint8).numpy().tobytes())
    data = b"".join(parts)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def _unpack_tokens(words: list[int]) -> list[int]:
    """server_tokens::deserialize: a packed state, or a plain token list (older llama-server)."""
    if not words or words[0] != TOKENS_NULL:
        return words
    if len(words) < 4 or words[1] != TOKENS_STATE_VERSION:
        raise SlotFileError("Unsupported server tokens state version")
    n = words[2]
    if n < 0 or 3 + n + 1 > len(words):
        raise SlotFileError("Unexpected end of server tokens state")
    if words[3 + n] != 0:
        raise SlotFileError("Cannot restore media tokens without an mmproj")
    return words[3:3 + n]


def read_slot_file(path: str, kv, n_stream: int = 1) -> tuple[list[int], dict, int]:
    """Read a slot file (as `write_slot_file` or llama-server writes it) for a cache shaped like
    `kv` whose slots use `n_stream` streams; the cells of the one stream that has any are restored."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        magic, version, n_words = struct.unpack_from("<III", data, 0)
        if magic != SEQ_MAGIC or version != SEQ_VERSION:
            raise SlotFileError("bad magic or version")
        off = 12
        tokens = _unpack_tokens(np.frombuffer(data, dtype=np.int32, count=n_words, offset=off).tolist())
        off += 4 * n_words
        (file_streams,) = struct.unpack_from("<I", data, off)
        off += 4
        if file_streams != n_stream:
            raise SlotFileError("n_stream mismatch")
        dtype = {val: key for key, val in GGML_TYPE.items()}
        out = None
        n = 0
        for _ in range(file_streams):
            (count,) = struct.unpack_from("<I", data, off)
            off += 4
            if count == 0:
                continue
            if out is not None:
                raise SlotFileError("cells of more than one stream")
            n = count
            off += 12 * n
            v_trans, n_layer = struct.unpack_from("<II", data, off)
            off += 8
            if n_layer != kv.n_layers or v_trans != 0:
                raise SlotFileError("layer count mismatch")
            out = {}
            for name in ("k", "v"):
                layers = []
                for _ in range(n_layer):
                    gtype, row_bytes = struct.unpack_from("<iQ", data, off)
                    off += 12
                    if gtype not in dtype or row_bytes != kv.n_kv_heads * kv.head_dim * torch.empty((), dtype=dtype[gtype]).element_size():
                        raise SlotFileError("KV shape mismatch")
                    if off + n * row_bytes > len(data):
                        raise SlotFileError("truncated file")
                    raw = torch.frombuffer(bytearray(data[off: off + n * row_bytes]), dtype=torch.uint8)
                    off += n * row_bytes
                    layers.append(raw.view(dtype[gtype]).view(n, kv.n_kv_heads, kv.head_dim))
                out[name] = torch.stack(layers)
        if out is None:
            shape = (kv.n_layers, 0, kv.n_kv_heads, kv.head_dim)
            out = {"k": torch.empty(shape, dtype=kv.dtype), "v": torch.empty(shape, dtype=kv.dtype)}
        if n != len(tokens):
            raise SlotFileError("token count mismatch")
    except struct.error as e:
        raise SlotFileError(str(e)) from e
    return tokens, out, len(data)

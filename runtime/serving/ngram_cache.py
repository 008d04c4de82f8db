"""ngram-cache drafting (`--spec-type ngram-cache`, `-lcs` / `-lcd`): llama.cpp b1-0c1e570's
common/ngram-cache.cpp and common_speculative_impl_ngram_cache (common/speculative.cpp), line for line.

A cache maps an n-gram (1 to 4 tokens, LLAMA_NGRAM_MIN..MAX) to the tokens that followed it and
how often. Each slot has three: the context cache (its own token history), the dynamic cache
(`-lcd FILE`, earlier generations) and the static cache (`-lcs FILE`, a corpus's 2-grams; it also
validates the other two's candidates). A draft is built one token at a time: the longest n-gram of
the context cache whose most frequent follower is frequent enough (the "lax" thresholds), else
the dynamic cache's (the "strict" ones), else the static cache's 2-gram; at most 8 tokens.

b1's quirks kept as they are: the context cache of a slot is never cleared (it spans that slot's
tasks) and only grows by the tokens past the longest history it has seen; its n-grams do not
cross the boundary between two updates; the dynamic cache is read, never updated or written.

Files: llama.cpp's common_ngram_cache_save layout, native (little-endian) int32s: per n-gram
4 tokens (-1 pads a shorter one), the number of distinct followers, then (token, count) pairs.

Which follower wins a tie is the one first in a libstdc++ `unordered_map<int, int>`'s iteration
order (b1 keeps the first maximum it meets); `stl_order` replays that order from the order the
tokens were inserted, so drafts match b1's token for token and a saved file matches llama.cpp's
byte for byte (tests/test_ngram_cache.py checks both against the C++ code: scripts/ngram_cache_ref.cpp).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2  # LLAMA_NGRAM_MIN / _MAX / _STATIC
N_DRAFT = 8  # create_state_ngram_cache: n_draft = 8
NULL = -1  # LLAMA_TOKEN_NULL
MIN_SAMPLE_LAX, MIN_PERCENT_LAX = (2, 2, 1, 1), (66, 50, 50, 50)
MIN_SAMPLE_STRICT, MIN_PERCENT_STRICT = (4, 3, 2, 2), (75, 66, 66, 66)

Ngram = tuple  # (t0, t1, t2, t3), NULL-padded

# ---- libstdc++'s unordered_map iteration order ----------------------------------------------------
# A default-constructed std::unordered_map (GCC 12's libstdc++) gets 13 buckets at its first insert
# and grows when an insert would pass one element per bucket, to _Prime_rehash_policy::_M_next_bkt(2 x
# the bucket count): these (scripts/ngram_cache_ref.cpp `growth` prints them).
GROWTH = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061, 712697, 1447153,
          2938679, 5967347, 12117689, 24607243, 49969847, 101473717, 206062531, 418451333, 849749479, 1725587117,
          3504151727, 8589934583, 25769803693, 68719476731, 206158430123)
M64 = (1 << 64) - 1
_FIB = 11400714819323198485  # common_token_hash_function


def token_hash(tok: int) -> int:
    """std::hash<int>: the value as size_t."""
    return tok & M64


def ngram_hash(key: Ngram) -> int:
    """common_ngram_hash_function."""
    h = 0
    for t in key:
        h ^= ((t & M64) * _FIB) & M64
    return h


def stl_order(keys: list, hashes: list[int]) -> list:
    """The iteration order of a default-constructed std::unordered_map after emplacing `keys`
    (distinct, in this order; `hashes` their hash codes): a new key goes first in its bucket's run,
    a key into an empty bucket first in the list; a growth replays the list by the same rule."""
    n = len(keys)
    order = list(range(n))  # indices, in the map's current order
    limit, g = 0, 0
    runs: list[list[int]] = []  # built newest-last; the map's order is reversed(runs), each reversed
    where: dict[int, list[int]] = {}
    n_bkt = 1
    for i in range(n):
        if i + 1 > limit:  # _M_need_rehash: grow, replay what is there
            n_bkt = GROWTH[g] if g < len(GROWTH) else _grow_past(n_bkt)
            g += 1
            limit = n_bkt
            current = [x for run in reversed(runs) for x in reversed(run)]
            runs, where = [], {}
            for x in current:
                _place(x, hashes[x] % n_bkt, runs, where)
        _place(i, hashes[i] % n_bkt, runs, where)
    order = [x for run in reversed(runs) for x in reversed(run)]
    return [keys[x] for x in order]


def _place(x: int, bkt: int, runs: list[list[int]], where: dict[int, list[int]]) -> None:
    run = where.get(bkt)
    if run is None:
        run = where[bkt] = []
        runs.append(run)
    run.append(x)


def _grow_past(n_bkt: int) -> int:
    raise OverflowError(f"a map larger than {n_bkt} entries")


# ---- a cache ---------------------------------------------------------------------------------
@dataclass
class NgramCache:
    """common_ngram_cache: n-gram -> {follower: count}, the followers in insertion order (dicts
    keep it); `_order` caches each part's libstdc++ order until a new follower arrives."""
    parts: dict[Ngram, dict[int, int]] = field(default_factory=dict)
    _order: dict[Ngram, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.parts)

    def order(self, ngram: Ngram) -> list[int]:
        o = self._order.get(ngram)
        if o is None:
            keys = list(self.parts[ngram])
            o = self._order[ngram] = stl_order(keys, [token_hash(k) for k in keys])
        return o

    def update(self, inp: list[int], nnew: int, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        """common_ngram_cache_update: count what followed each n-gram ending in the last `nnew` tokens."""
        size = len(inp)
        pad = (NULL,) * NGRAM_MAX
        for n in range(ngram_min, ngram_max + 1):
            for i in range(max(size - nnew, n), size):
                key = tuple(inp[i - n:i]) + pad[n:]
                tok = inp[i]
                part = self.parts.get(key)
                if part is None:
                    self.parts[key] = {tok: 1}
                elif tok in part:
                    part[tok] += 1
                else:
                    part[tok] = 1
                    self._order.pop(key, None)

    def merge(self, other: NgramCache) -> None:
        """common_ngram_cache_merge."""
        for key, part in other.parts.items():
            mine = self.parts.get(key)
            if mine is None:
                self.parts[key] = dict(part)
                continue
            for tok, count in part.items():
                if tok not in mine:
                    self._order.pop(key, None)
                mine[tok] = mine.get(tok, 0) + count

    # ---- files (common_ngram_cache_save / _load) ----------------------------------------------
    def save(self, path: str | Path) -> None:
        """common_ngram_cache_save, records in the C++ map's order: the same bytes as llama.cpp
        writes for a cache built by the same updates (or loaded from the same file)."""
        keys = list(self.parts)
        out = bytearray()
        for key in stl_order(keys, [ngram_hash(k) for k in keys]):
            part = self.parts[key]
            out += struct.pack("<5i", *key, len(part))
            for tok in self.order(key):
                out += struct.pack("<2i", tok, part[tok])
        Path(path).write_bytes(bytes(out))

    @classmethod
    def load(cls, path: str | Path) -> NgramCache:
        """A file written by common_ngram_cache_save. ValueError where llama.cpp's GGML_ASSERTs stop
        (a truncated record, a count or follower number below 1); a trailing piece shorter than an
        n-gram is ignored, as the C++ read loop ends there. OSError when it cannot be read."""
        data = Path(path).read_bytes()
        cache, parts = cls(), {}
        pos, end = 0, len(data)
        while pos + 16 <= end:
            key = struct.unpack_from("<4i", data, pos)
            pos += 16
            if pos + 4 > end:
                raise ValueError("truncated n-gram record")
            (ntokens,) = struct.unpack_from("<i", data, pos)
            pos += 4
            if ntokens <= 0:
                raise ValueError(f"n-gram with {ntokens} tokens")
            if pos + 8 * ntokens > end:
                raise ValueError("truncated n-gram record")
            vals = struct.unpack_from(f"<{2 * ntokens}i", data, pos)
            pos += 8 * ntokens
            part: dict[int, int] = {}
            for tok, count in zip(vals[::2], vals[1::2]):
                if count <= 0:
                    raise ValueError(f"token count {count}")
                part.setdefault(tok, count)  # emplace: the first of a repeated token stays
            parts.setdefault(key, part)  # emplace: the first of a repeated n-gram stays
        cache.parts = parts
        return cache


# ---- drafting (common_ngram_cache_draft) -----------------------------------------------------
def _try_static(nc_static: NgramCache, ngram: Ngram) -> int:
    part = nc_static.parts.get(ngram)
    if part is None:
        return NULL
    max_count = total = 0
    max_token = NULL
    for tok in nc_static.order(ngram):
        count = part[tok]
        if count > max_count:
            max_token, max_count = tok, count
        total += count
    if total < MIN_SAMPLE_LAX[NGRAM_STATIC - 1] or 100 * max_count < MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total:
        return NULL
    return max_token


def _try_primary(nc: NgramCache, ngrams: list[Ngram], part_static: dict[int, int], min_sample, min_percent) -> int:
    for i in range(len(ngrams) - 1, -1, -1):
        key = ngrams[i]
        if key is None:
            continue
        part = nc.parts.get(key)
        if part is None:
            continue
        max_p = max_s = total = 0
        max_token = NULL
        for tok in nc.order(key):
            cp = part[tok]
            cs = 100 * part_static[tok] if tok in part_static else 1
            if cp * cs > max_p * max_s:
                max_token, max_p, max_s = tok, cp, cs
            total += cp
        if total < min_sample[i] or 100 * max_p < min_percent[i] * total:
            continue
        return max_token
    return NULL


def cache_draft(inp: list[int], id_last: int, n_draft: int, nc_context: NgramCache, nc_dynamic: NgramCache,
                nc_static: NgramCache) -> list[int]:
    """common_ngram_cache_draft for `inp` (the history, id_last already appended): up to n_draft
    tokens. An n-gram that would start before the history (a 1-token prompt: b1 reads out of
    bounds there) is not looked up."""
    if len(inp) < NGRAM_STATIC:
        return []
    seq = list(inp[-NGRAM_MAX:])  # the n-grams read only the last NGRAM_MAX tokens of history + draft
    pad = (NULL,) * NGRAM_MAX
    out: list[int] = []
    while len(out) < n_draft:
        n_seq = len(seq)
        ngram_static = tuple(seq[n_seq - NGRAM_STATIC:]) + pad[NGRAM_STATIC:]
        part_static = nc_static.parts.get(ngram_static, {})
        ngrams_cd = [tuple(seq[n_seq - n:]) + pad[n:] if n_seq >= n else None for n in range(NGRAM_MIN, NGRAM_MAX + 1)]
        tok = _try_primary(nc_context, ngrams_cd, part_static, MIN_SAMPLE_LAX, MIN_PERCENT_LAX)
        if tok == NULL:
            tok = _try_primary(nc_dynamic, ngrams_cd, part_static, MIN_SAMPLE_STRICT, MIN_PERCENT_STRICT)
        if tok == NULL:
            tok = _try_static(nc_static, ngram_static)
        if tok == NULL:
            break
        out.append(tok)
        seq.append(tok)
    return out


# ---- the drafter (common_speculative_impl_ngram_cache) ---------------------------------------
@dataclass
class _Seq:
    cache_size: int = 0  # tokens of history the context cache has seen
    context: NgramCache = field(default_factory=NgramCache)


class NgramCacheDrafter:
    """Per slot a context cache; the static and dynamic caches loaded once (b1 copies them into
    every slot; they are never changed, so the slots share them here)."""

    def __init__(self, n_seq: int, path_static: str = "", path_dynamic: str = ""):
        self.seqs = [_Seq() for _ in range(n_seq)]
        self.static = load_lookup_cache(path_static, "static") if path_static else NgramCache()
        self.dynamic = load_lookup_cache(path_dynamic, "dynamic") if path_dynamic else NgramCache()

    def begin(self, sid: int, prompt) -> None:
        pass

    def draft(self, sid: int, prompt, id_last: int) -> list[int]:
        si = self.seqs[sid]
        hist = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
        if si.cache_size < len(hist) + 1:
            new = hist[si.cache_size:] + [id_last]
            si.context.update(new, len(new))
            si.cache_size = len(hist) + 1
        hist.append(id_last)
        return cache_draft(hist, id_last, N_DRAFT, si.context, self.dynamic, self.static)

    def accept(self, sid: int, n_accepted: int, is_other: bool) -> None:
        pass


class LookupCacheError(RuntimeError):
    """A -lcs / -lcd file that cannot be read: llama-server aborts there (GGML_ABORT)."""


def load_lookup_cache(path: str, kind: str) -> NgramCache:
    try:
        return NgramCache.load(path)
    except (OSError, ValueError) as e:
        raise LookupCacheError(f"failed to open {kind} lookup cache: {path} ({e}): "
                               f"Couldn't read {kind} lookup cache") from None

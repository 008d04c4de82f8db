"""ngram-map-k / ngram-map-k4v drafting: llama.cpp b1-0c1e570's common_ngram_map (common/ngram-map.cpp),
one map per slot, line for line.

The map remembers key n-grams of the slot's token history (by their index in it) and, for
ngram-map-k4v, up to four m-grams that followed each with their counts; a hash table from the key's
hash to an index speeds the search of the latest earlier occurrence of the last n tokens. A draft
is the m-gram after that occurrence (k: always; k4v: the most frequent value once it clearly
dominates), no longer than the number of tokens accepted the last time that value was drafted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from runtime.spec_config import NgramMapParams

MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES
MAX_VALUE_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
HASH_MAP_SIZE = 262144  # COMMON_NGRAM_HASH_MAP_SIZE
LCG_FACTOR = 2654435761
M32 = (1 << 32) - 1


def _hash(tokens: list[int], start: int, n: int) -> int:
    h = 0
    for i in range(n):
        h = (h * LCG_FACTOR + (tokens[start + i] & M32)) & M32
    return h


@dataclass
class _Value:
    value_idx: int = 0  # where the m-gram starts in the history (0: unused)
    value_num: int = 0
    n_accepted: int = -1


@dataclass
class _Key:
    key_idx: int
    stat_idx: int = 0
    key_num: int = 0
    values: list[_Value] = field(default_factory=list)


class NgramMap:
    """common_ngram_map of one sequence."""

    def __init__(self, p: NgramMapParams, key_only: bool):
        self.n, self.m, self.key_only, self.min_hits = p.size_n, p.size_m, key_only, p.min_hits
        self.keys: list[_Key] = []
        self.size_last_begin = 0
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0
        self.idx_last_check = 0
        self.key_map: dict[int, int] = {}  # hash % HASH_MAP_SIZE -> index of the n-gram (absent: 0)
        self.key_map_last_idx = 0

    def begin(self, size_begin: int) -> None:
        """common_ngram_map_begin: a new generation on `size_begin` tokens of history; what lay
        past a shrunk history is forgotten."""
        n, m = self.n, self.m
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - n - m if size_begin > n + m else 0
        if size_begin < self.idx_last_check:
            self.key_map = {h: i for h, i in self.key_map.items() if i < cleanup}
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            for i in range(len(self.keys) - 1, -1, -1):
                key = self.keys[i]
                if key.key_idx >= cleanup:
                    del self.keys[i]
                    continue
                if self.key_only:
                    continue
                for j in range(MAX_VALUES - 1, -1, -1):
                    v = key.values[j]
                    if v.value_idx != 0 and v.value_idx >= cleanup:
                        for k in range(j, MAX_VALUES - 1):
                            key.values[k] = _Value(**vars(key.values[k + 1]))
                        last = key.values[MAX_VALUES - 1]
                        last.value_idx = last.value_num = 0
                if key.values[0].value_idx == 0:
                    del self.keys[i]
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin

    def _search(self, inp: list[int], key: list[int], hi: int, lo_excl: int) -> int:
        """The largest j in (lo_excl, hi] (also > key_map_last_idx) where the key n-gram starts; 0 if none."""
        n = self.n
        j = hi
        while j > lo_excl and j > self.key_map_last_idx:
            if inp[j:j + n] == key:
                return j
            j -= 1
        return 0

    def _index(self, inp: list[int], hi: int, lo_excl: int) -> None:
        n = self.n
        j = hi
        while j > lo_excl and j > self.key_map_last_idx:
            self.key_map.setdefault(_hash(inp, j, n) % HASH_MAP_SIZE, j)  # collisions keep the first
            j -= 1

    def draft(self, inp: list[int], sampled: int) -> list[int]:
        """common_ngram_map_draft."""
        self.last_draft_created = False
        self.last_draft_key_idx = self.last_draft_value_idx = 0
        cur_len, n, m = len(inp), self.n, self.m
        if cur_len < 2 * n + m:
            return []
        self.idx_last_check = cur_len
        key_tokens = inp[cur_len - n + 1:] + [sampled]
        match_pos = 0
        idx_key = self.key_map.get(_hash(key_tokens, 0, n) % HASH_MAP_SIZE, 0)
        if idx_key != 0 and idx_key < cur_len - n - m - 1 and inp[idx_key:idx_key + n] == key_tokens:
            match_pos = idx_key
        if match_pos == 0 and self.size_last_begin > n + m + 1:
            match_pos = self._search(inp, key_tokens, self.size_last_begin - n - m - 1, -1)
        if match_pos == 0:
            match_pos = self._search(inp, key_tokens, cur_len - n - m - 1, self.size_last_begin)
        if self.size_last_begin > n + m + 1:
            self._index(inp, self.size_last_begin - n - m - 1, -1)
        self._index(inp, cur_len - n - m - 1, self.size_last_begin)
        self.key_map_last_idx = max(cur_len - n - m - 1, self.key_map_last_idx)
        if match_pos == 0:
            return []
        key_offset = next((i for i, k in enumerate(self.keys) if inp[k.key_idx:k.key_idx + n] == key_tokens), None)
        if key_offset is None:
            key_offset = len(self.keys)
            self.keys.append(_Key(match_pos, values=[_Value(0, 0, m) for _ in range(MAX_VALUES)]))
        cur = self.keys[key_offset]
        cur.key_num = min(cur.key_num + 1, MAX_VALUE_COUNT)
        if self.key_only:
            n_draft = min(m, cur.values[0].n_accepted)
            self.last_draft_created, self.last_draft_key_idx, self.last_draft_value_idx = True, key_offset, 0
            return inp[match_pos + n:match_pos + n + max(0, n_draft)]
        if cur.key_num < self.min_hits:
            return []
        for i in range(cur.stat_idx, match_pos + 1):
            if inp[i:i + n] != key_tokens:
                continue
            begin = i + n
            idx_value = -1
            for v in range(MAX_VALUES):
                vi = cur.values[v].value_idx
                if vi == 0:
                    cur.values[v] = _Value(begin, 0, m)
                    idx_value = v
                    break
                if inp[begin:begin + m] == inp[vi:vi + m]:
                    idx_value = v
                    break
            if idx_value >= 0:
                cur.values[idx_value].value_num = min(cur.values[idx_value].value_num + 1, MAX_VALUE_COUNT)
        cur.stat_idx = match_pos
        max_occur, slot_max = 0, 0
        for v in range(MAX_VALUES):
            if cur.values[v].value_num > max_occur:
                max_occur, slot_max = cur.values[v].value_num, v
        sum_occur = sum(cur.values[v].value_num for v in range(MAX_VALUES) if v != slot_max)
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []
        n_draft = min(m, cur.values[slot_max].n_accepted)
        self.last_draft_created, self.last_draft_key_idx, self.last_draft_value_idx = True, key_offset, slot_max
        return inp[match_pos + n:match_pos + n + max(0, n_draft)]

    def accept(self, n_accepted: int) -> None:
        """common_ngram_map_accept: the next draft of that value is at most this long."""
        if not self.last_draft_created:
            return
        self.keys[self.last_draft_key_idx].values[self.last_draft_value_idx].n_accepted = n_accepted


class NgramMapDrafter:
    """common_speculative_impl_ngram_map_k (key_only: ngram-map-k; else ngram-map-k4v), a map per slot."""

    own_length = True  # drafts no longer than the key's last accepted run (spec_adapt.py leaves it be)

    def __init__(self, p: NgramMapParams, key_only: bool, n_seq: int):
        self.maps = [NgramMap(p, key_only) for _ in range(n_seq)]

    def begin(self, sid: int, prompt: np.ndarray) -> None:
        self.maps[sid].begin(len(prompt))

    def draft(self, sid: int, prompt: np.ndarray, id_last: int) -> list[int]:
        return self.maps[sid].draft(prompt.tolist(), id_last)

    def accept(self, sid: int, n_accepted: int, is_other: bool) -> None:
        if not is_other:
            self.maps[sid].accept(n_accepted)

"""Per-model token bytes, laid out once for vectorised mask computation (grammar/matcher.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Vocab:
    """Per-model token bytes, prepared once for mask computation.

    token_pieces[i] is token i's bytes (b"" for tokens that never match text);
    eog_ids are the end-of-generation tokens (allowed only where the grammar can end).
    """
    token_pieces: list[bytes]
    eog_ids: frozenset[int]
    n_vocab: int = 0
    order: np.ndarray = field(default=None, repr=False)  # [n_walk] token ids, by length desc
    counts: list[int] = field(default=None, repr=False)  # counts[j] = #walked tokens longer than j
    cols: list[np.ndarray] = field(default=None, repr=False)  # cols[j]: [counts[j]] uint8 byte j
    eog_index: torch.Tensor = field(default=None, repr=False)  # [n_eog] int64

    def __init__(self, token_pieces: list[bytes], eog_ids) -> None:
        self.token_pieces = [bytes(p) for p in token_pieces]
        self.n_vocab = len(self.token_pieces)
        self.eog_ids = frozenset(int(i) for i in eog_ids if 0 <= int(i) < self.n_vocab)
        lens = np.array([len(p) for p in self.token_pieces], dtype=np.int64)
        for i in self.eog_ids:
            lens[i] = 0
        walk = np.nonzero(lens > 0)[0]
        self.order = walk[np.argsort(-lens[walk], kind="stable")]
        sorted_lens = lens[self.order]
        max_len = int(sorted_lens[0]) if len(sorted_lens) else 0
        self.counts = [int(np.count_nonzero(sorted_lens > j)) for j in range(max_len)]
        # byte matrix [n_walk, max_len] built row by row would be large; build ragged columns
        flat = np.frombuffer(b"".join(self.token_pieces[i] for i in self.order), dtype=np.uint8)
        starts = np.zeros(len(self.order) + 1, dtype=np.int64)
        np.cumsum(sorted_lens, out=starts[1:])
        self.cols = [flat[starts[: self.counts[j]] + j] for j in range(max_len)]
        self.eog_index = torch.tensor(sorted(self.eog_ids), dtype=torch.int64)

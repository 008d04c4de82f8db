"""The per-slot draft length (runtime/serving/spec_adapt.py): the cap that maximizes expected tokens
per verify cost under the slot's acceptance, b1's full length until a draft is rejected, no draft
(but a probe) when drafts do not pay, and the Speculator applying it except to ngram-map-k."""
from __future__ import annotations

import numpy as np

from runtime.serving.spec import Speculator
from runtime.serving.spec_adapt import PROBE, DraftLength, best_length
from runtime.spec_config import NgramMapParams, SpecConfig, SpecType


def _brute(q: float, n_max: int, c: float) -> int:
    vals = [sum(q ** i for i in range(k + 1)) / (1 + c * k) for k in range(n_max + 1)]
    return int(np.argmax(vals))


def test_best_length_is_the_argmax():
    for q in (0.0, 0.05, 0.2, 0.5, 0.8, 0.9, 0.97, 1.0):
        for c in (0.05, 0.12, 0.4):
            assert best_length(q, 48, c) == _brute(q, 48, c), (q, c)
    assert best_length(1.0, 48, 0.12) == 48 and best_length(0.0, 48, 0.12) == 0
    assert best_length(0.9, 48, 0.12) < best_length(0.97, 48, 0.12) < 48


def test_draft_length_follows_acceptance():
    d = DraftLength(48)
    assert d.cap() == 48 and d.allow(30) == 30  # no rejection yet: b1's full length
    d.update(30, 30)
    assert d.cap() == 48
    d.update(48, 20)  # cut at 20: still a long run
    long_cap = d.cap()
    assert 10 < long_cap < 48
    for _ in range(30):  # then every draft rejected at once
        d.update(d.allow(48) or 1, 0)
    assert d.cap() == 0
    allowed = [d.allow(48) for _ in range(3 * PROBE)]
    assert allowed.count(1) == 3 and set(allowed) == {0, 1}  # a one-token probe every PROBE drafts
    for _ in range(20):  # the text turns repetitive: probes accepted, the cap grows back
        d.update(1, 1)
    assert d.cap() >= 8


def test_speculator_caps_drafts_per_slot_not_map_k():
    toks = [9] + list(range(100, 140)) + [7] + list(range(100, 139))
    sp = Speculator(SpecConfig(types=(SpecType.NGRAM_SIMPLE,), ngram_simple=NgramMapParams(3, 30, 1)), 2)
    for sid in (0, 1):
        sp.begin(sid, toks)
    full = sp.draft(0, toks, 139, 64)
    assert len(full) == 30 == len(sp.draft(1, toks, 139, 64))
    for _ in range(6):
        sp.draft(0, toks, 139, 64)
        sp.accept(0, 0)  # slot 0's drafts rejected
    assert sp.draft(0, toks, 139, 64) == [] and len(sp.draft(1, toks, 139, 64)) == 30  # slot 1 unaffected
    sp.begin(0, toks)  # a new task starts from the full length again
    assert len(sp.draft(0, toks, 139, 64)) == 30
    mk = Speculator(SpecConfig(types=(SpecType.NGRAM_MAP_K,), ngram_map_k=NgramMapParams(3, 30, 1)), 1)
    mk.begin(0, toks)
    mk.lengths[0].update(30, 0)  # even a slot that would not draft: map-k keeps b1's own rule
    assert mk.lengths[0].cap() == 0 and len(mk.draft(0, toks, 139, 64)) == 30

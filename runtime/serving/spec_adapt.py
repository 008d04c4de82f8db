"""How long a slot's next draft may be, from how its drafts fared (tritium's rule; llama-server
b1-0c1e570 drafts up to the same n_max every step: min(what the drafter makes, n_ctx room,
n_predict left - 1); its own adaptive pieces live in the drafters and stay as they are: ngram-map-k's
per-key "no longer than last time's accepted run", ngram-mod's reset after five poor drafts).

Why: a verify row is not free. On the CPU a forward of 1 + k rows costs about (1 + c k) decode
steps, c = ROW_COST (scripts/bench_spec.py --verify-cost measures it), so drafts that are mostly
rejected make a slot slower than not speculating (prose), while long accepted runs (code edits)
want the longest draft. The rule: model acceptance as a chain in which each draft token is
accepted with probability q, estimated per slot from its verify steps (accepted tokens vs
rejections, exponentially decayed so the estimate follows the text); a draft of k tokens then
yields E(k) = 1 + q + ... + q^k tokens for 1 + c k of cost, and the cap is the k that maximizes
E(k) / (1 + c k) (0 = do not draft: then one step in PROBE still drafts one token, to notice the
text turning repetitive). Until the slot's first rejection the cap is n_max (as b1). Drafters
with their own length rule (ngram-map-k, -k4v) are not capped: theirs is b1's. Greedy outputs do
not depend on any of this; only how many rows each step verifies.
"""
from __future__ import annotations

from dataclasses import dataclass

ROW_COST = 0.12  # c: the cost of one more verify row in decode steps (CPU, Qwen2.5-0.5B Q4_K_M; see above)
DECAY = 0.8  # per verify step: the weight of older evidence
PROBE = 8  # with a cap of 0, every PROBE-th draft still goes, one token long


def best_length(q: float, n_max: int, row_cost: float = ROW_COST) -> int:
    """argmax over k in [0, n_max] of (1 + q + ... + q^k) / (1 + row_cost k) (unimodal: stops
    at the first decrease)."""
    best_k, best, e, term = 0, 1.0, 1.0, 1.0
    for k in range(1, n_max + 1):
        term *= q
        e += term
        f = e / (1.0 + row_cost * k)
        if f <= best:
            break
        best_k, best = k, f
    return best_k


@dataclass
class DraftLength:
    """One slot's acceptance record for its running task."""
    n_max: int
    hits: float = 0.0  # draft tokens accepted (decayed)
    misses: float = 0.0  # drafts cut short by a rejection (decayed)
    n_skipped: int = 0  # drafts dropped while the cap was 0

    @property
    def q(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 1.0

    def cap(self) -> int:
        """The longest draft worth verifying now."""
        if self.misses == 0:
            return self.n_max
        return best_length(self.q, self.n_max)

    def allow(self, n_draft: int) -> int:
        """How many of a proposed n_draft tokens to verify."""
        cap = self.cap()
        if cap > 0:
            return min(n_draft, cap)
        self.n_skipped += 1
        return min(n_draft, 1) if self.n_skipped % PROBE == 0 else 0

    def update(self, n_draft: int, n_accepted: int) -> None:
        self.hits = self.hits * DECAY + n_accepted
        self.misses = self.misses * DECAY + (1.0 if n_accepted < n_draft else 0.0)

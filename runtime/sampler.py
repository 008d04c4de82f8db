"""llama.cpp's sampler chain over a batch of logit rows.

Each row has its own `SamplingParams` and `SamplerState` (history, RNG, grammar matcher).
Order, as llama.cpp's common sampler builds it: logit bias (and ignore_eos) -> grammar mask ->
the `samplers` list (penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature)
-> draw from the distribution. Temperature <= 0 keeps only the most likely token (greedy).
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import kernels
from runtime.tasks import SamplingParams

NEG_INF = float("-inf")


@dataclass
class SamplerState:
    params: SamplingParams
    eog_ids: frozenset[int]
    seed: int = 0
    history: deque = field(default_factory=lambda: deque(maxlen=4096))
    grammar: Any = None  # grammar.Matcher: allowed_mask() / advance()
    rng: torch.Generator = field(default_factory=torch.Generator)
    dry_breakers: frozenset[int] = frozenset()
    mu: float = 0.0  # Mirostat's running maximum surprise (2 tau at the start)

    def __post_init__(self) -> None:
        seed = self.params.seed
        if seed is None or seed == 0xFFFFFFFF or seed < 0:
            seed = random.getrandbits(32)
        self.seed = seed
        self.rng.manual_seed(seed)
        self.mu = 2.0 * self.params.mirostat_tau

    def accept(self, token: int, grammar: bool = True) -> None:
        self.history.append(token)
        if grammar and self.grammar is not None and token not in self.eog_ids:
            self.grammar.advance(token)


@dataclass
class Sampled:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # (id, logprob) of the n_probs most likely, when asked


# ---- the individual samplers, on a candidate set (vals [n] float32, ids [n] int64) -----------

def _penalties(vals, ids, p: SamplingParams, st: SamplerState):
    if p.repeat_last_n == 0 or (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0):
        return vals, ids
    n = p.repeat_last_n if p.repeat_last_n > 0 else len(st.history)
    last = list(st.history)[-n:] if n else []
    if not last:
        return vals, ids
    counts: dict[int, int] = {}
    for t in last:
        counts[t] = counts.get(t, 0) + 1
    tok = torch.tensor(list(counts.keys()), dtype=torch.int64)
    cnt = torch.tensor(list(counts.values()), dtype=torch.float32)
    if ids is None:
        pos = tok[tok < vals.numel()]
        cnt = cnt[tok < vals.numel()]
    else:
        lookup = {int(t): i for i, t in enumerate(ids.tolist())}
        keep = [(lookup[int(t)], c) for t, c in zip(tok.tolist(), cnt.tolist()) if int(t) in lookup]
        if not keep:
            return vals, ids
        pos = torch.tensor([k for k, _ in keep], dtype=torch.int64)
        cnt = torch.tensor([c for _, c in keep], dtype=torch.float32)
    v = vals[pos]
    v = torch.where(v <= 0, v * p.repeat_penalty, v / p.repeat_penalty)
    v = v - cnt * p.frequency_penalty - p.presence_penalty
    vals = vals.clone()
    vals[pos] = v
    return vals, ids


def _dry(vals, ids, p: SamplingParams, st: SamplerState):
    """DRY ("don't repeat yourself"): penalise tokens that would extend a repeated sequence."""
    if p.dry_multiplier <= 0 or p.dry_base < 1.0:
        return vals, ids
    hist = list(st.history)
    n = p.dry_penalty_last_n
    if n > 0:
        hist = hist[-n:]
    if len(hist) < 2:
        return vals, ids
    breakers = st.dry_breakers
    # longest suffix (not crossing a breaker) of hist that also ends right before position j
    best: dict[int, int] = {}
    last = len(hist) - 1
    for j in range(last):  # a match of the context's suffix ending at j; hist[j + 1] would repeat
        length = 0
        while j - length >= 0 and hist[j - length] == hist[last - length] and hist[j - length] not in breakers:
            length += 1
        nxt = hist[j + 1]
        if length > 0 and nxt not in breakers and length > best.get(nxt, 0):
            best[nxt] = length
    if not best:
        return vals, ids
    vals = vals.clone()
    lookup = None if ids is None else {int(t): i for i, t in enumerate(ids.tolist())}
    for tok, length in best.items():
        if length >= p.dry_allowed_length:
            pen = p.dry_multiplier * p.dry_base ** (length - p.dry_allowed_length)
            i = tok if lookup is None else lookup.get(tok)
            if i is not None and i < vals.numel():
                vals[i] -= pen
    return vals, ids


def _ensure_ids(vals, ids):
    if ids is None:
        ids = torch.arange(vals.numel(), dtype=torch.int64)
    return vals, ids


def _top_n_sigma(vals, ids, p: SamplingParams, st):
    if p.top_n_sigma <= 0:
        return vals, ids
    finite = vals[torch.isfinite(vals)]
    if finite.numel() == 0:
        return vals, ids
    thr = finite.max() - p.top_n_sigma * finite.std(unbiased=False)
    return torch.where(vals >= thr, vals, torch.full_like(vals, NEG_INF)), ids


def _top_k(vals, ids, p: SamplingParams, st):
    k = p.top_k
    if k <= 0 or k >= vals.numel():
        return vals, ids
    k = max(k, p.min_keep)
    if vals.numel() > 4096:  # long rows: the kernels' selection (numpy on the CPU, ~10x torch's)
        top_v, top_i = kernels.topk(vals, k)
    else:
        top_v, top_i = torch.topk(vals, k)
    return top_v, (top_i if ids is None else ids[top_i])


def _sorted_probs(vals, ids):
    vals, ids = _ensure_ids(vals, ids)
    order = torch.argsort(vals, descending=True)
    vals, ids = vals[order], ids[order]
    probs = torch.softmax(vals, 0)
    return vals, ids, probs


def _top_p(vals, ids, p: SamplingParams, st):
    if p.top_p >= 1.0:
        return vals, ids
    vals, ids, probs = _sorted_probs(vals, ids)
    cum = torch.cumsum(probs, 0)
    n = int(torch.searchsorted(cum, torch.tensor(p.top_p, dtype=cum.dtype)).item()) + 1
    n = max(n, p.min_keep, 1)
    return vals[:n], ids[:n]


def _min_p(vals, ids, p: SamplingParams, st):
    if p.min_p <= 0.0:
        return vals, ids
    vals, ids, probs = _sorted_probs(vals, ids)
    keep = probs >= p.min_p * probs[0]
    n = max(int(keep.sum().item()), p.min_keep, 1)
    return vals[:n], ids[:n]


def _typical(vals, ids, p: SamplingParams, st):
    if p.typical_p >= 1.0:
        return vals, ids
    vals, ids, probs = _sorted_probs(vals, ids)
    logp = torch.log(probs.clamp_min(1e-30))
    ent = -(probs * logp).sum()
    shifted = (-logp - ent).abs()
    order = torch.argsort(shifted)
    cum = torch.cumsum(probs[order], 0)
    n = int(torch.searchsorted(cum, torch.tensor(p.typical_p, dtype=cum.dtype)).item()) + 1
    n = max(n, p.min_keep, 1)
    sel = order[:n]
    return vals[sel], ids[sel]


def _xtc(vals, ids, p: SamplingParams, st: SamplerState):
    if p.xtc_probability <= 0.0 or p.xtc_threshold > 0.5:
        return vals, ids
    if torch.rand((), generator=st.rng).item() >= p.xtc_probability:
        return vals, ids
    vals, ids, probs = _sorted_probs(vals, ids)
    above = int((probs >= p.xtc_threshold).sum().item())
    if above < 2:
        return vals, ids
    n_left = vals.numel() - (above - 1)
    if n_left < max(p.min_keep, 1):
        return vals, ids
    return vals[above - 1:], ids[above - 1:]


def _temperature(vals, ids, p: SamplingParams, st):
    t = p.temperature
    if t <= 0.0:
        i = int(torch.argmax(vals).item())
        vals, ids = _ensure_ids(vals, ids)
        return vals[i:i + 1], ids[i:i + 1]
    if p.dynatemp_range > 0:
        lo, hi = max(0.0, t - p.dynatemp_range), t + p.dynatemp_range
        probs = torch.softmax(vals, 0)
        ent = -(probs * torch.log(probs.clamp_min(1e-30))).sum().item()
        max_ent = math.log(max(vals.numel(), 2))
        t = lo + (hi - lo) * (ent / max_ent) ** p.dynatemp_exponent
    return vals / t, ids


SAMPLERS = {
    "penalties": _penalties,
    "dry": _dry,
    "top_n_sigma": _top_n_sigma,
    "top_k": _top_k,
    "typ_p": _typical,
    "typical_p": _typical,
    "top_p": _top_p,
    "min_p": _min_p,
    "xtc": _xtc,
    "temperature": _temperature,
}


def apply_bias_and_mask(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    """Logit bias, ignore_eos and the grammar mask on one full logit row [V] (in place)."""
    p = st.params
    for tok, bias in p.logit_bias:
        if 0 <= tok < row.numel():
            row[tok] = NEG_INF if bias == NEG_INF else row[tok] + bias
    if p.ignore_eos:
        for t in st.eog_ids:
            if t < row.numel():
                row[t] = NEG_INF
    if st.grammar is not None:
        mask = st.grammar.allowed_mask()  # [V] bool; EOG allowed exactly when the grammar may end
        n = min(mask.numel(), row.numel())
        row[:n].masked_fill_(~mask[:n].to(row.device), NEG_INF)
        if n < row.numel():
            row[n:] = NEG_INF
    return row


def sample_row(row: torch.Tensor, st: SamplerState) -> Sampled:
    """Sample one token from a full logit row [V] float32 (row is modified)."""
    p = st.params
    # n_probs: llama-server reports the model's own distribution (the raw logits, before biases,
    # ignore_eos and the grammar) unless post_sampling_probs asks for the sampler's
    lp = torch.log_softmax(row, 0) if p.n_probs > 0 and not p.post_sampling_probs else None
    row = apply_bias_and_mask(row, st)
    if p.n_probs > 0 and lp is None:  # post_sampling_probs: the candidates the chain left, as drawn
        return _draw_with_post_sampling_probs(row, st)
    top: list[tuple[int, float]] = []
    if p.n_probs > 0:
        tv, ti = torch.topk(lp, min(p.n_probs, lp.numel()))
        top = list(zip(ti.tolist(), tv.tolist()))
    if p.mirostat in (1, 2) and p.temperature > 0:  # llama.cpp's chain: bias, temperature, Mirostat
        tok = _mirostat(row, st)
        return Sampled(tok, float(lp[tok].item()) if lp is not None else 0.0, top)
    simple_greedy = p.temperature <= 0 and p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 \
        and p.presence_penalty == 0.0 and p.dry_multiplier <= 0
    if simple_greedy:
        tok = int(torch.argmax(row).item())
    else:
        tok = _chain_and_draw(row, None, st)
    logprob = float(lp[tok].item()) if lp is not None else 0.0
    return Sampled(tok, logprob, top)


def _chain(vals: torch.Tensor, ids: torch.Tensor | None, st: SamplerState) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler chain in `samplers` order over vals (ids None: vals is the whole row): the
    candidates left (vals [n], ids [n])."""
    p = st.params
    for name in p.samplers:
        fn = SAMPLERS.get(name)
        if fn is not None:
            vals, ids = fn(vals, ids, p, st)
    return _ensure_ids(vals, ids)


def _draw(vals: torch.Tensor, ids: torch.Tensor, st: SamplerState) -> int:
    """llama.cpp's dist sampler: one token from the softmax of the candidates."""
    if vals.numel() == 1:
        return int(ids[0].item())
    probs = torch.softmax(vals, 0)
    if not torch.isfinite(probs).all() or probs.sum() <= 0:
        return int(ids[torch.argmax(vals)].item())
    return int(ids[torch.multinomial(probs, 1, generator=st.rng)].item())


def _chain_and_draw(vals: torch.Tensor, ids: torch.Tensor | None, st: SamplerState) -> int:
    """Run the sampler chain over vals and draw one token from what is left."""
    return _draw(*_chain(vals, ids, st), st)


def _mirostat(row: torch.Tensor, st: SamplerState) -> int:
    """Mirostat (1) and Mirostat 2.0 (2) as llama.cpp's samplers: the candidates of the tempered
    row sorted by probability, cut to the top k estimated from the Zipf exponent of the 100 most
    likely (1) or to those whose surprise -log2 p is at most mu (2), one drawn from them
    renormalized; mu moves by eta times the drawn token's surprise error."""
    p = st.params
    probs, order = torch.sort(torch.softmax(row / p.temperature, 0), descending=True)
    if p.mirostat == 1:
        n = min(99, probs.numel() - 1)  # m = 100
        i = torch.arange(n, dtype=torch.float32)
        t_i = torch.log((i + 2) / (i + 1))
        b_i = torch.log(probs[:n] / probs[1:n + 1])
        s_hat = float((t_i * b_i).sum() / (t_i * t_i).sum())
        eps = s_hat - 1.0
        try:
            k = (eps * 2.0 ** st.mu / (1.0 - float(row.numel()) ** -eps)) ** (1.0 / s_hat)
            n_keep = max(int(k), 1) if math.isfinite(k) else 1
        except (ZeroDivisionError, OverflowError, ValueError):
            n_keep = 1
    else:
        over = torch.nonzero(-torch.log2(probs) > st.mu)
        n_keep = max(int(over[0]) if over.numel() else probs.numel(), 1)
    kept = probs[:n_keep] / probs[:n_keep].sum()
    j = int(torch.multinomial(kept, 1, generator=st.rng)) if n_keep > 1 else 0
    st.mu -= p.mirostat_eta * (-math.log2(max(float(kept[j]), 1e-45)) - p.mirostat_tau)
    return int(order[j])


def _draw_with_post_sampling_probs(row: torch.Tensor, st: SamplerState) -> Sampled:
    """post_sampling_probs as llama-server's populate_token_probs: the chain's candidates with the
    probabilities the draw used (the softmax of what is left, so 1.0 for greedy), most likely
    first, the first n_probs with a nonzero probability; the drawn token's own probability."""
    vals, ids = _chain(row, None, st)
    tok = _draw(vals, ids, st)
    probs = torch.softmax(vals.double(), 0) if vals.numel() > 1 else torch.ones(1, dtype=torch.float64)
    order = torch.argsort(probs, descending=True, stable=True)
    ranked = [(int(ids[i]), float(probs[i])) for i in order[:st.params.n_probs].tolist()]
    top = [(t, math.log(pr)) for t, pr in ranked if pr > 0.0]
    hit = torch.nonzero(ids == tok)  # (a candidate list may be the whole vocabulary: no Python loop)
    mine = float(probs[int(hit[0])]) if hit.numel() else 0.0
    return Sampled(tok, math.log(mine) if mine > 0.0 else NEG_INF, top)


def sample_candidates(vals: torch.Tensor, ids: torch.Tensor, st: SamplerState) -> Sampled:
    """Sample from a row's top-k candidates (CPU vals [k] descending, ids [k]) for a state whose
    chain starts with top_k (`topk_needed`): the same chain as `sample_row` on the whole row, since
    its top_k step keeps exactly these."""
    return Sampled(_chain_and_draw(vals, ids, st), 0.0, [])


def topk_rows(rows: torch.Tensor, picks: list[tuple[int, int, tuple[int, ...]]],
              batched: bool | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(values [k] descending, ids [k]) on the CPU for each (row, k, banned) of `picks`; banned
    tokens are excluded. `batched` (default: rows on a device): one batched top-k where the rows
    are, so that only [n, k] values cross to the host; otherwise numpy selection row by row."""
    V = rows.shape[1]
    if not (rows.device.type != "cpu" if batched is None else batched):
        out = []
        for i, k, banned in picks:
            r = rows[i].numpy()  # banned entries set and restored through numpy: rows may be inference tensors
            if banned:
                saved = r[list(banned)].copy()
                r[list(banned)] = NEG_INF
            out.append(kernels.topk(rows[i], min(k, V)))
            if banned:
                r[list(banned)] = saved
        return out
    sel = rows.index_select(0, torch.tensor([i for i, _, _ in picks], device=rows.device))
    for j, (_, _, banned) in enumerate(picks):
        if banned:
            sel[j, torch.tensor(banned, device=rows.device)] = NEG_INF
    kmax = min(max(k for _, k, _ in picks), V)
    vals, ids = torch.topk(sel, kmax, dim=1)
    vals, ids = vals.cpu(), ids.cpu()
    return [(vals[j, :min(k, V)], ids[j, :min(k, V)]) for j, (_, k, _) in enumerate(picks)]


def sample_batch(logits: torch.Tensor, states: list[SamplerState]) -> list[Sampled]:
    """Sample one token per row of logits [N, V] (float32, CPU or device)."""
    rows = logits.float()
    greedy_rows = [i for i, st in enumerate(states) if _is_plain_greedy(st)]
    out: list[Sampled | None] = [None] * len(states)
    if greedy_rows and rows.device.type == "cpu":
        for i in greedy_rows:  # numpy's argmax is ~10x torch's on one long row
            out[i] = Sampled(_greedy_cpu(rows[i].numpy(), states[i]), 0.0, [])
    elif greedy_rows:
        idx = torch.tensor(greedy_rows, device=rows.device)
        sel = rows.index_select(0, idx)
        for j, i in enumerate(greedy_rows):  # bias and ignore_eos touch a few entries in place
            p = states[i].params
            if p.logit_bias or p.ignore_eos:
                apply_bias_and_mask(sel[j], states[i])
        toks = torch.argmax(sel, dim=1).tolist()
        for i, t in zip(greedy_rows, toks):
            out[i] = Sampled(int(t), 0.0, [])
    picks = []
    for i, st in enumerate(states):
        if out[i] is None:
            k, banned = topk_needed(st)
            if k > 0:
                picks.append((i, k, banned))
    if picks:  # top_k-first chains: only k candidates per row go through the chain
        for (i, _, _), (vals, ids) in zip(picks, topk_rows(rows, picks)):
            out[i] = sample_candidates(vals, ids, states[i])
    cpu_rows = None
    for i, st in enumerate(states):
        if out[i] is None:
            if cpu_rows is None:
                cpu_rows = rows.cpu()
            out[i] = sample_row(cpu_rows[i].clone(), st)
    return out  # type: ignore[return-value]


def topk_needed(st: SamplerState | None) -> tuple[int, tuple[int, ...]]:
    """How many of a row's largest logits the sampler can look at, when that is all it looks at:
    (1, …) for plain greedy, (top_k, …) when top_k comes first among the active samplers; (0, ())
    when it needs the whole row (grammar, finite logit biases, penalties, n_probs, other orders).
    The second value lists the banned tokens (ignore_eos, -inf biases)."""
    if st is None:
        return 0, ()
    p = st.params
    if st.grammar is not None or p.n_probs > 0 or p.dry_multiplier > 0 or \
            p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        return 0, ()
    # a -inf bias only bans its token (ignore_eos arrives as such biases, as llama-server echoes
    # them); any other nonzero bias can move a token into the top-k: the whole row is needed
    if any(b != NEG_INF and b != 0.0 for _, b in p.logit_bias):
        return 0, ()
    bans = {t for t, b in p.logit_bias if b == NEG_INF}
    if p.ignore_eos:
        bans |= set(st.eog_ids)
    banned = tuple(sorted(bans))
    if p.temperature <= 0:
        return 1, banned
    if p.mirostat in (1, 2):  # Mirostat reads the whole distribution
        return 0, ()
    for name in p.samplers:
        if name == "top_k":
            return (max(p.top_k, p.min_keep), banned) if p.top_k > 0 else (0, ())
        if name in ("penalties", "dry") or (name == "top_n_sigma" and p.top_n_sigma <= 0):
            continue  # inactive (checked above)
        return 0, ()
    return 0, ()


def _greedy_cpu(row: np.ndarray, st: SamplerState) -> int:
    """argmax of one logit row [V] after logit bias and ignore_eos, leaving the row as it was
    (plain greedy states have no grammar: only those few entries change)."""
    p = st.params
    touched = [t for t, _ in p.logit_bias if 0 <= t < row.size]
    if p.ignore_eos:
        touched += [t for t in st.eog_ids if t < row.size]
    if not touched:
        return int(row.argmax())
    saved = row[touched].copy()
    apply_bias_and_mask(torch.from_numpy(row), st)  # a plain tensor on the same memory
    tok = int(row.argmax())
    row[touched] = saved
    return tok


def _is_plain_greedy(st: SamplerState) -> bool:
    p = st.params
    return (p.temperature <= 0 and st.grammar is None and p.n_probs == 0 and p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0
            and p.presence_penalty == 0.0 and p.dry_multiplier <= 0)

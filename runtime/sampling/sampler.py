"""llama.cpp's sampler chain over a batch of logit rows.

Each row has its own `SamplingParams` and `SamplerState` (history, RNG, grammar matcher, and its
logit biases as index/value arrays built once when the state is made). Order, as llama.cpp's
common sampler builds it: logit bias (and ignore_eos) -> grammar mask -> the `samplers` list
(runtime/sampling/samplers.py: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature)
-> draw from the distribution. Temperature <= 0 keeps only the most likely token (greedy).

`sample_batch` isolates its rows: an exception while sampling one row is that row's result (the
scheduler ends that request alone); every other row gets the token it would get alone.
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
from runtime.sampling.samplers import SAMPLERS, ensure_ids, mirostat
from runtime.tasks import SamplingParams

NEG_INF = float("-inf")
MAX_TOPK_BANS = 256  # more banned tokens than this: the whole row is sampled (no top-k shortcut)
MAX_TOPK = 4096  # a larger top_k reads the whole row


@dataclass
class SamplerState:
    params: SamplingParams
    eog_ids: frozenset[int]
    seed: int = 0
    history: deque = field(default_factory=lambda: deque(maxlen=4096))
    grammar: Any = None  # grammar.Matcher: allowed_mask() / advance()
    rng: torch.Generator = field(default_factory=torch.Generator)
    dry_breakers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # sorted ids
    mu: float = 0.0  # Mirostat's running maximum surprise (2 tau at the start)
    # the logit biases, summed per token in list order as llama.cpp adds them, ignore_eos's bans
    # included: bias_ids [n] int64 (unique, ascending), bias_vals [n] float32
    bias_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    bias_vals: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    bans: tuple[int, ...] = ()  # tokens whose bias is -inf (and EOG under ignore_eos)
    finite_bias: bool = False  # some bias is finite and nonzero (it can promote a token)
    # the reasoning budget (runtime/sampling/reasoning_budget.py): applied before everything else
    budget: Any = None
    _on_device: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        seed = self.params.seed
        if seed is None or seed == 0xFFFFFFFF or seed < 0:
            seed = random.getrandbits(32)
        self.seed = seed
        self.rng.manual_seed(seed)
        self.mu = 2.0 * self.params.mirostat_tau
        self._build_bias()

    def _build_bias(self) -> None:
        p = self.params
        pairs = [(t, b) for t, b in p.logit_bias if isinstance(t, int) and t >= 0]
        if p.ignore_eos:
            pairs += [(t, NEG_INF) for t in sorted(self.eog_ids)]
        if not pairs:
            return
        tok = np.fromiter((t for t, _ in pairs), dtype=np.int64, count=len(pairs))
        val = np.fromiter((b for _, b in pairs), dtype=np.float32, count=len(pairs))
        uniq, inv = np.unique(tok, return_inverse=True)
        total = np.zeros(uniq.size, dtype=np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            np.add.at(total, inv, val)  # unbuffered: in list order per token
        self.bias_ids, self.bias_vals = torch.from_numpy(uniq), torch.from_numpy(total)
        self.bans = tuple(uniq[total == NEG_INF].tolist())
        self.finite_bias = bool(((total != NEG_INF) & (total != 0.0)).any())

    def bias_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(bias_ids, bias_vals) on `device` (copied once per device)."""
        if device.type == "cpu":
            return self.bias_ids, self.bias_vals
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = (self.bias_ids.to(device), self.bias_vals.to(device))
        return self._on_device[key]

    def accept(self, token: int, grammar: bool = True) -> None:
        if self.budget is not None:
            self.budget.accept(token)
        self.history.append(token)
        if grammar and self.grammar is not None and token not in self.eog_ids:
            self.grammar.advance(token)


@dataclass
class Sampled:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # (id, logprob) of the n_probs most likely, when asked


def apply_bias(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    """The logit biases (and ignore_eos) on one full logit row [V], in place: one indexed add."""
    if st.bias_ids.numel():
        ids, vals = st.bias_on(row.device)
        if int(ids[-1]) >= row.numel():
            keep = st.bias_ids < row.numel()
            ids, vals = ids[keep.to(ids.device)], vals[keep.to(vals.device)]
        row.index_add_(0, ids, vals.to(row.dtype))
    return row


def forcing(st: SamplerState) -> int | None:
    """The token the reasoning budget forces now (it ends a reasoning block), or None."""
    return st.budget.forced_token() if st.budget is not None else None


def apply_bias_and_mask(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    """The reasoning budget's forced token, logit bias, ignore_eos and the grammar mask on one full
    logit row [V] (in place)."""
    forced = forcing(st)
    if forced is not None:  # llama.cpp applies the budget sampler first: every other logit -inf
        keep = float(row[forced]) if 0 <= forced < row.numel() else NEG_INF
        row.fill_(NEG_INF)
        if 0 <= forced < row.numel():
            row[forced] = keep
    apply_bias(row, st)
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
        tok = mirostat(row, st)
        return Sampled(tok, float(lp[tok].item()) if lp is not None else 0.0, top)
    simple_greedy = p.temperature <= 0 and p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 \
        and p.presence_penalty == 0.0 and p.dry_multiplier <= 0
    if simple_greedy:
        tok = _argmax_or_last(row)
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
    return ensure_ids(vals, ids)


def _draw(vals: torch.Tensor, ids: torch.Tensor, st: SamplerState) -> int:
    """llama.cpp's dist sampler: one token from the softmax of the candidates (no finite
    probability: the most likely candidate)."""
    if vals.numel() == 0:
        raise ValueError("no candidate token left to sample")
    if vals.numel() == 1:
        return int(ids[0].item())
    probs = torch.softmax(vals, 0)
    if not torch.isfinite(probs).all() or probs.sum() <= 0:
        return int(ids[_argmax_or_last(vals)].item())
    return int(ids[torch.multinomial(probs, 1, generator=st.rng)].item())


def _argmax_or_last(vals: torch.Tensor) -> int:
    """The most likely candidate; the last one when none is finite or more likely than -inf
    (llama.cpp's dist sampler: its running sum of NaN probabilities never reaches the target,
    so it falls back to the last candidate)."""
    i = int(torch.argmax(vals).item())
    v = float(vals[i])
    return vals.numel() - 1 if v == NEG_INF or v != v else i


def _chain_and_draw(vals: torch.Tensor, ids: torch.Tensor | None, st: SamplerState) -> int:
    """Run the sampler chain over vals and draw one token from what is left."""
    return _draw(*_chain(vals, ids, st), st)


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
        return [_topk_row(rows, i, k, banned) for i, k, banned in picks]
    sel = rows.index_select(0, torch.tensor([i for i, _, _ in picks], device=rows.device))
    for j, (_, _, banned) in enumerate(picks):
        if banned:
            sel[j, torch.tensor(banned, device=rows.device)] = NEG_INF
    kmax = min(max(k for _, k, _ in picks), V)
    vals, ids = torch.topk(sel, kmax, dim=1)
    vals, ids = vals.cpu(), ids.cpu()
    return [(vals[j, :min(k, V)], ids[j, :min(k, V)]) for j, (_, k, _) in enumerate(picks)]


def _topk_row(rows: torch.Tensor, i: int, k: int, banned: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One CPU row's top k without its banned tokens (set and restored through numpy: rows may
    be inference tensors)."""
    r = rows[i].numpy()
    if not banned:
        return kernels.topk(rows[i], min(k, r.size))
    at = np.asarray(banned, dtype=np.int64)
    saved = r[at].copy()
    try:
        r[at] = NEG_INF
        return kernels.topk(rows[i], min(k, r.size))
    finally:
        r[at] = saved


def _guarded(out: list, i: int, fn) -> None:
    """out[i] = fn(), or the exception it raised (that row alone fails)."""
    try:
        out[i] = fn()
    except Exception as e:  # noqa: BLE001 - handed to the scheduler, which ends this request
        out[i] = e


def sample_batch(logits: torch.Tensor, states: list[SamplerState]) -> list[Sampled | Exception]:
    """Sample one token per row of logits [N, V] (float32, CPU or device). A row whose sampling
    raises gets the exception as its result; a batched phase that raises (a device top-k or
    argmax) leaves its rows to the per-row path, so no row's token depends on another row."""
    rows = logits.float()
    n = len(states)
    out: list[Sampled | Exception | None] = [None] * n
    greedy_rows = []
    for i, st in enumerate(states):
        _guarded(out, i, lambda: None if not _is_plain_greedy(st) else greedy_rows.append(i))
    if greedy_rows and rows.device.type == "cpu":
        for i in greedy_rows:  # numpy's argmax is ~10x torch's on one long row
            _guarded(out, i, lambda: Sampled(_greedy_cpu(rows[i].numpy(), states[i]), 0.0, []))
    elif greedy_rows:
        try:
            idx = torch.tensor(greedy_rows, device=rows.device)
            sel = rows.index_select(0, idx)
            for j, i in enumerate(greedy_rows):  # bias and ignore_eos touch a few entries in place
                apply_bias(sel[j], states[i])
            toks = torch.argmax(sel, dim=1).tolist()
            for i, t in zip(greedy_rows, toks):
                out[i] = Sampled(int(t), 0.0, [])
        except Exception:  # noqa: BLE001 - these rows go the per-row way below
            pass
    picks = []
    for i, st in enumerate(states):
        if out[i] is None:
            _guarded(out, i, lambda: (lambda k, b: picks.append((i, k, b)) if k > 0 else None)(*topk_needed(st)))
    if picks:  # top_k-first chains: only k candidates per row go through the chain
        try:
            cands = topk_rows(rows, picks)
        except Exception:  # noqa: BLE001 - row by row, each on its own
            cands = [None] * len(picks)
        for (i, k, banned), c in zip(picks, cands):
            _guarded(out, i, lambda: sample_candidates(*(c if c is not None else _topk_row(rows.cpu(), i, k, banned)),
                                                       states[i]))
    cpu_rows = None
    for i, st in enumerate(states):
        if out[i] is None:
            if cpu_rows is None:
                cpu_rows = rows.cpu()
            _guarded(out, i, lambda: sample_row(cpu_rows[i].clone(), st))
    return out  # type: ignore[return-value]


def topk_needed(st: SamplerState | None) -> tuple[int, tuple[int, ...]]:
    """How many of a row's largest logits the sampler can look at, when that is all it looks at:
    (1, …) for plain greedy, (top_k, …) when top_k comes first among the active samplers; (0, ())
    when it needs the whole row (grammar, finite logit biases, penalties, n_probs, other orders,
    more than MAX_TOPK_BANS bans, a top_k over MAX_TOPK). The second value lists the banned tokens
    (ignore_eos, -inf biases). Read from the state's precomputed biases: no per-step work that
    grows with the request's lists."""
    if st is None:
        return 0, ()
    p = st.params
    if st.grammar is not None or forcing(st) is not None or p.n_probs > 0 or p.dry_multiplier != 0 or \
            p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        return 0, ()
    # a -inf bias only bans its token (ignore_eos arrives as such biases, as llama-server echoes
    # them); any other nonzero bias can move a token into the top-k: the whole row is needed
    if st.finite_bias or len(st.bans) > MAX_TOPK_BANS:
        return 0, ()
    if p.temperature <= 0:
        return 1, st.bans
    if p.mirostat in (1, 2):  # Mirostat reads the whole distribution
        return 0, ()
    for name in p.samplers:
        if name == "top_k":  # llama.cpp's top_k keeps min(top_k, candidates): min_keep plays no part
            return (p.top_k, st.bans) if 0 < p.top_k <= MAX_TOPK else (0, ())
        if name in ("penalties", "dry") or (name == "top_n_sigma" and p.top_n_sigma <= 0):
            continue  # inactive (checked above)
        return 0, ()
    return 0, ()


def _greedy_cpu(row: np.ndarray, st: SamplerState) -> int:
    """argmax of one logit row [V] after logit bias and ignore_eos, leaving the row as it was
    (plain greedy states have no grammar: only the biased entries change)."""
    if not st.bias_ids.numel():
        return int(row.argmax())  # (a model row has finite logits)
    at = st.bias_ids.numpy()
    if at[-1] >= row.size:
        at = at[at < row.size]
    saved = row[at].copy()
    try:
        t = torch.from_numpy(row)  # a plain tensor on the same memory
        apply_bias(t, st)
        return _argmax_or_last(t)
    finally:
        row[at] = saved


def _is_plain_greedy(st: SamplerState) -> bool:
    p = st.params
    return (p.temperature <= 0 and st.grammar is None and forcing(st) is None and p.n_probs <= 0 and p.repeat_penalty == 1.0
            and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0 and p.dry_multiplier == 0)

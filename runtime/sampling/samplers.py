"""The samplers of llama.cpp's chain (src/llama-sampler.cpp of b1-0c1e570), on a candidate set.

Each takes (vals [n] float32, ids [n] int64 or None when vals is the whole row), the request's
`SamplingParams` and its `SamplerState`, and returns the candidates left. Extreme inputs behave
as llama.cpp's float code does, never as a Python exception: `powf` overflow is inf, an entropy
of 0 raised to a negative power is inf, `min_keep` past the candidates keeps them all, top_k is
clamped to the candidates (llama.cpp's top_k ignores min_keep), one candidate skips dynatemp.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import kernels

NEG_INF = float("-inf")
FLOAT_MAX_LOG = 88.7228391  # log(FLT_MAX): DRY's exponent clamp


def _f32(x: float) -> float:
    """x rounded to float32 (inf on overflow), as a C `float` holds it."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.float32(x))


def _powf(base: float, exp: float) -> float:
    """C's pow in double, inf on overflow (Python raises OverflowError or ZeroDivisionError)."""
    with np.errstate(all="ignore"):
        return float(np.power(np.float64(base), np.float64(exp)))


def penalties(vals, ids, p, st):
    if p.repeat_last_n == 0 or (p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0):
        return vals, ids
    hist = st.history
    n = min(p.repeat_last_n, len(hist)) if p.repeat_last_n > 0 else len(hist)
    if n <= 0:
        return vals, ids
    last = np.fromiter(hist, dtype=np.int64, count=len(hist))[-n:]
    tok, cnt = np.unique(last, return_counts=True)
    if ids is None:
        keep = tok < vals.numel()
        pos, cnt = torch.from_numpy(tok[keep]), torch.from_numpy(cnt[keep].astype(np.float32))
    else:
        idn = ids.numpy()
        order = np.argsort(idn, kind="stable")
        at = np.searchsorted(idn[order], tok)
        hit = (at < idn.size) & (idn[order][np.minimum(at, idn.size - 1)] == tok)
        if not hit.any():
            return vals, ids
        pos = torch.from_numpy(order[at[hit]])
        cnt = torch.from_numpy(cnt[hit].astype(np.float32))
    v = vals[pos]
    v = torch.where(v <= 0, v * p.repeat_penalty, v / p.repeat_penalty)
    v = v - cnt * p.frequency_penalty - p.presence_penalty
    vals = vals.clone()
    vals[pos] = v
    return vals, ids


def _suffix_matches(r: np.ndarray, limit: int) -> np.ndarray:
    """z[k] = min(length of the common prefix of r and r[k:], limit) for k in 1..len(r)-1 (z[0]
    unused): llama.cpp's reverse Z-algorithm over the history, vectorised by match length while
    few positions still match, then the linear Z-algorithm itself."""
    n = r.size
    z = np.zeros(n, dtype=np.int64)
    active = np.arange(1, n)
    length = 0
    while active.size and length < limit:
        if length >= 64 and active.size > 8:  # a long repeat: the linear algorithm from here
            return _z_linear(r.tolist(), limit)
        ok = active + length < n
        active = active[ok]
        active = active[r[active + length] == r[length]]
        z[active] += 1
        length += 1
    return z


def _z_linear(r: list[int], limit: int) -> np.ndarray:
    n = len(r)
    z = np.zeros(n, dtype=np.int64)
    lt = rt = 0
    zl = [0] * n
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and r[m] == r[m + k]:
                m += 1
            zl[k] = m
            if m > 0:
                lt, rt = k, k + m - 1
        elif zl[k - lt] < rt - k + 1:
            zl[k] = zl[k - lt]
        else:
            i = rt + 1
            while i < n and r[i] == r[i - k]:
                i += 1
            zl[k] = i - k
            lt, rt = k, i - 1
    z[:] = np.minimum(np.array(zl, dtype=np.int64), limit)
    return z


def dry_breaker_ids(tokenizer, breakers: list[str]) -> np.ndarray:
    """The ids of the sequence breakers that are one token each (sorted, unique int64): built once
    per request where it is parsed, so a DRY step costs the same with 4 breakers or a million."""
    ids = set()
    for b in breakers:
        toks = tokenizer.encode(b, add_special=False, parse_special=False)
        if len(toks) == 1:
            ids.add(int(toks[0]))
    return np.array(sorted(ids), dtype=np.int64)


def dry(vals, ids, p, st):
    """DRY ("don't repeat yourself", llama_sampler_dry_apply): a token that would extend a repeat of
    the context's suffix by more than dry_allowed_length tokens loses multiplier * base^(len -
    allowed), the exponent clamped so that the power stays finite (single-token sequence breakers
    end repeats and are never penalised)."""
    if p.dry_multiplier == 0.0 or p.dry_base < 1.0 or p.dry_penalty_last_n == 0:
        return vals, ids
    n = len(st.history) if p.dry_penalty_last_n < 0 else min(len(st.history), p.dry_penalty_last_n)
    if n <= p.dry_allowed_length:
        return vals, ids
    h = np.fromiter(st.history, dtype=np.int64, count=len(st.history))[-n:]
    rep_limit = n
    if st.dry_breakers.size:
        hits = np.nonzero(np.isin(h, st.dry_breakers, assume_unique=False))[0]
        if hits.size:
            rep_limit = n - 1 - int(hits[-1])
    if rep_limit < p.dry_allowed_length:
        return vals, ids
    z = _suffix_matches(h[::-1].copy(), rep_limit)  # z[k]: repeat of the suffix ending k tokens back
    counts = z[1:][::-1]  # counts[i] (i = 0..n-2): repeat ending at h[i]; h[i + 1] would extend it
    sel = np.nonzero(counts >= p.dry_allowed_length)[0]
    if not sel.size:
        return vals, ids
    toks, lens = h[sel + 1], counts[sel]
    order = np.lexsort((lens, toks))  # the longest repeat per token: the last of each token's run
    toks, lens = toks[order], lens[order]
    last = np.append(toks[1:] != toks[:-1], True)
    toks, lens = toks[last], lens[last]
    if st.dry_breakers.size:
        keep = ~np.isin(toks, st.dry_breakers)
        toks, lens = toks[keep], lens[keep]
    max_exp = int(_f32(FLOAT_MAX_LOG / _f32(math.log(p.dry_base)))) if p.dry_base > 1.000001 else 0
    exps = lens - p.dry_allowed_length
    if max_exp > 0:
        exps = np.minimum(exps, max_exp)
    with np.errstate(all="ignore"):
        pen = (np.float64(p.dry_multiplier) * np.power(np.float64(p.dry_base), exps.astype(np.float64))).astype(np.float32)
    if ids is None:
        ok = toks < vals.numel()
        pos, pen = torch.from_numpy(toks[ok]), torch.from_numpy(pen[ok])
    else:
        idn = ids.numpy()
        lookup = {int(t): i for i, t in enumerate(idn)} if idn.size <= 4096 else None
        if lookup is None:
            mask = np.isin(idn, toks)
            where = np.nonzero(mask)[0]
            m = dict(zip(toks.tolist(), pen.tolist()))
            pos, pen = torch.from_numpy(where), torch.tensor([m[int(t)] for t in idn[where]], dtype=torch.float32)
        else:
            pairs = [(lookup[int(t)], v) for t, v in zip(toks.tolist(), pen.tolist()) if int(t) in lookup]
            if not pairs:
                return vals, ids
            pos = torch.tensor([i for i, _ in pairs], dtype=torch.int64)
            pen = torch.tensor([v for _, v in pairs], dtype=torch.float32)
    vals = vals.clone()
    vals[pos] -= pen
    return vals, ids


def ensure_ids(vals, ids):
    if ids is None:
        ids = torch.arange(vals.numel(), dtype=torch.int64)
    return vals, ids


def top_n_sigma(vals, ids, p, st):
    if p.top_n_sigma <= 0 or vals.numel() <= 1:
        return vals, ids
    valid = vals[vals != NEG_INF]
    if valid.numel() == 0:
        return vals, ids
    mx, std = valid.max(), valid.std(unbiased=False)
    thr = mx - torch.tensor(p.top_n_sigma, dtype=torch.float32) * std
    return torch.where(vals < thr, torch.full_like(vals, NEG_INF), vals), ids  # NaN: nothing masked


def top_k(vals, ids, p, st):
    k = p.top_k
    if k <= 0 or k >= vals.numel():
        return vals, ids
    if vals.numel() > 4096:  # long rows: the kernels' selection (numpy on the CPU, ~10x torch's)
        top_v, top_i = kernels.topk(vals, k)
    else:
        top_v, top_i = torch.topk(vals, k)
    return top_v, (top_i if ids is None else ids[top_i])


def sorted_probs(vals, ids):
    vals, ids = ensure_ids(vals, ids)
    order = torch.argsort(vals, descending=True, stable=True)
    vals, ids = vals[order], ids[order]
    probs = torch.softmax(vals, 0)
    return vals, ids, probs


def top_p(vals, ids, p, st):
    if p.top_p >= 1.0 or vals.numel() == 0:
        return vals, ids
    vals, ids, probs = sorted_probs(vals, ids)
    cum = torch.cumsum(probs, 0)
    n = int(torch.searchsorted(cum, torch.tensor(p.top_p, dtype=cum.dtype)).item()) + 1
    n = max(n, p.min_keep, 1)
    return vals[:n], ids[:n]


def min_p(vals, ids, p, st):
    if p.min_p <= 0.0 or vals.numel() == 0:
        return vals, ids
    vals, ids, probs = sorted_probs(vals, ids)
    keep = probs >= p.min_p * probs[0]
    n = max(int(keep.sum().item()), p.min_keep, 1)
    return vals[:n], ids[:n]


def typical(vals, ids, p, st):
    if p.typical_p >= 1.0 or vals.numel() == 0:
        return vals, ids
    vals, ids, probs = sorted_probs(vals, ids)
    logp = torch.log(probs.clamp_min(1e-30))
    ent = -(probs * logp).sum()
    shifted = (-logp - ent).abs()
    order = torch.argsort(shifted, stable=True)
    cum = torch.cumsum(probs[order], 0)
    n = int(torch.searchsorted(cum, torch.tensor(p.typical_p, dtype=cum.dtype), right=True).item()) + 1
    n = max(n, p.min_keep, 1)
    sel = order[:n]
    return vals[sel], ids[sel]


def xtc(vals, ids, p, st):
    if p.xtc_probability <= 0.0 or p.xtc_threshold > 0.5 or vals.numel() < 2:
        return vals, ids
    if torch.rand((), generator=st.rng).item() >= p.xtc_probability:
        return vals, ids
    vals, ids, probs = sorted_probs(vals, ids)
    above = int((probs >= p.xtc_threshold).sum().item())
    if above < 2:
        return vals, ids
    n_left = vals.numel() - (above - 1)
    if n_left < max(p.min_keep, 1):
        return vals, ids
    return vals[above - 1:], ids[above - 1:]


def temperature(vals, ids, p, st):
    """llama_sampler_temp_ext: plain temperature, or dynatemp from the candidates' entropy (one
    candidate or none: left as it is)."""
    t = p.temperature
    if p.dynatemp_range > 0:
        if vals.numel() <= 1:
            return vals, ids
        lo, hi = max(0.0, t - p.dynatemp_range), t + p.dynatemp_range
        probs = torch.softmax(vals, 0)
        pos = probs[probs > 0]
        ent = float(-(pos * torch.log(pos)).sum())
        max_ent = -math.log(1.0 / vals.numel())
        with np.errstate(all="ignore"):
            t = float(np.float32(lo) + np.float32(hi - lo) * np.power(np.float32(ent / max_ent), np.float32(p.dynatemp_exponent)))
    if t <= 0.0 or math.isnan(t):
        if math.isnan(t):
            return torch.full_like(vals, float("nan")), ids
        i = int(torch.argmax(vals).item())
        vals, ids = ensure_ids(vals, ids)
        return vals[i:i + 1], ids[i:i + 1]
    return vals / t, ids


SAMPLERS = {
    "penalties": penalties,
    "dry": dry,
    "top_n_sigma": top_n_sigma,
    "top_k": top_k,
    "typ_p": typical,
    "typical_p": typical,
    "top_p": top_p,
    "min_p": min_p,
    "xtc": xtc,
    "temperature": temperature,
}


def mirostat(row: torch.Tensor, st) -> int:
    """Mirostat (1) and Mirostat 2.0 (2) as llama.cpp's samplers: the candidates of the tempered
    row sorted by probability, cut to the top k estimated from the Zipf exponent of the 100 most
    likely (1) or to those whose surprise -log2 p is at most mu (2), one drawn from them
    renormalized; mu moves by eta times the drawn token's surprise error. A row without a finite
    logit draws its first candidate (llama.cpp's fallback when no probability is finite)."""
    p = st.params
    probs, order = torch.sort(torch.softmax(row / p.temperature, 0), descending=True, stable=True)
    if not torch.isfinite(probs).all():
        return int(order[0])
    if p.mirostat == 1:
        n = min(99, probs.numel() - 1)  # m = 100
        i = torch.arange(n, dtype=torch.float32)
        t_i = torch.log((i + 2) / (i + 1))
        b_i = torch.log(probs[:n] / probs[1:n + 1])
        s_hat = float((t_i * b_i).sum() / (t_i * t_i).sum()) if n > 0 else 0.0
        eps = s_hat - 1.0
        with np.errstate(all="ignore"):
            k = float(np.power(np.float64(eps) * np.power(2.0, st.mu) / (1.0 - np.power(float(row.numel()), -eps)),
                               1.0 / s_hat)) if s_hat != 0.0 else float("nan")
        n_keep = max(int(k), 1) if math.isfinite(k) else 1
    else:
        over = torch.nonzero(-torch.log2(probs) > st.mu)
        n_keep = max(int(over[0]) if over.numel() else probs.numel(), 1)
    kept = probs[:n_keep] / probs[:n_keep].sum()
    j = int(torch.multinomial(kept, 1, generator=st.rng)) if n_keep > 1 and torch.isfinite(kept).all() else 0
    st.mu -= p.mirostat_eta * (-math.log2(max(float(kept[j]), 1e-45)) - p.mirostat_tau)
    return int(order[j])

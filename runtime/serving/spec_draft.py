"""Draft-model speculative decoding (`-md FILE --spec-type draft-simple`, llama.cpp b1-0c1e570's
common_speculative_impl_draft_simple): a second, smaller model of the same vocabulary drafts up to
n_max tokens per slot; the target verifies them in its one batched forward (runtime/serving/spec.py's
verify rows; `Scheduler._verify_drafts`).

`DraftModel` is the one owner of the draft's state: its weights, its own K/V (`KVStore` and
`BlockManager`, the only writer of the draft's block tables) and, per slot, the tokens whose K/V the
draft's cache holds. The draft's cache is kept by content, not by events: before drafting, a slot's
draft cache is cut to its common prefix with the target's cached tokens and the rest is fed (the
prompt the first time; after a verify step the tokens the target accepted). So prompt caching, slot
reuse, slot files, context shifts and rejected drafts can never leave the draft with K/V of tokens
the target does not hold (a changed prefix is recomputed); llama-server feeds the draft every batch
the target decodes and removes what the target removed, to the same effect.

Drafting, per step, all drafting slots in one forward of the draft model (b1's draft(): the last
sampled token at the next position, then one row per slot still drafting):
- greedy requests (and samplers whose distribution is not a function of the logits: XTC, Mirostat,
  n_probs): b1's draft sampler, top-k 10: the most likely token, while its probability among those 10
  is at least --spec-draft-p-min; the target samples each row and keeps the draft up to the first
  token it did not sample (b1's common_sampler_sample_and_accept_n). For a draft that is a function of
  the context (a one-hot q) that is the standard rejection rule itself: accepted with probability
  p(d), otherwise a token from p without d.
- temperature > 0: the draft token is *sampled* from q, the request's own truncation chain
  (top-k, top-p, min-p, typical, top-n-sigma, temperature; no penalties, biases or grammar) over
  the draft's logits, and verified with the standard rule (`rejection_sample`): kept with probability
  min(1, p/q), where p is what the target's sampler would draw from at that row (its whole chain:
  biases, grammar, penalties, truncation, temperature); on a rejection the token comes from
  norm(max(0, p - q)). The output distribution is that of sampling without a draft, and a
  stochastic draft is accepted more often than b1's sample-and-compare would accept it. (b1 samples
  the target and compares with the argmax draft: the same distribution, fewer accepted tokens at a
  high temperature, and the same seed gives the same tokens with and without a draft; here the
  random draws differ, so a seeded sampled request's tokens depend on the draft.)
The drafting stops at n_max, at the slot's own bound, or when the top probability is below p_min
(a stop decided before the token is drawn, so the kept tokens are draws from q); a draft shorter
than --spec-draft-n-min is dropped.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from runtime.model.decoder import Model, SeqBatch
from runtime.model.kv_store import SeqKV
from runtime.sampling.samplers import SAMPLERS, ensure_ids
from runtime.sampling.sampler import Sampled, SamplerState, _chain, apply_bias_and_mask
from runtime.serving.blocks import BlockManager, OutOfBlocks
from runtime.serving.plan import StepPlan
from runtime.serving.runner import ModelRunner
from runtime.serving.slots import common_prefix

Log = Callable[[str, str], None]

SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128  # common/speculative.cpp
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5
DRAFT_TOP_K = 10  # b1's draft sampler: top_k 10, then dist
INCOMPATIBLE = "draft model vocab type must match target model to use speculation"


@dataclass(frozen=True)
class DraftParams:
    """common_params_speculative_draft's sizes: --spec-draft-n-max / -n-min / -p-min."""
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0


@dataclass
class DraftRequest:
    """One slot's draft this step: its cached tokens (text only), the sampled token not yet in the
    cache, the most tokens it may draft, and the request's sampler (None: b1's greedy draft)."""
    sid: int
    tokens: list[int]
    id_last: int
    n_max: int
    sampler: SamplerState | None = None


@dataclass
class Draft:
    tokens: list[int]
    # per drafted token, the distribution it was drawn from: (ids [n] int64, probs [n] float64);
    # None for a greedy draft (verified by sampling and comparing)
    q: list[tuple[torch.Tensor, torch.Tensor]] | None = None


# ---- the vocabularies ----------------------------------------------------------------------------

def vocab_mismatch(tgt, dft) -> str | None:
    """common_speculative_are_compatible: None when the draft's vocabulary can draft for the
    target, else what differs (b1 logs it; the error is INCOMPATIBLE)."""
    if tgt.vocab_type != dft.vocab_type:
        return (f"draft model vocab type must match target model to use speculation but vocab_type_dft = "
                f"{dft.vocab_type} while vocab_type_tgt = {tgt.vocab_type}")
    if tgt.add_bos != dft.add_bos or (tgt.add_bos and tgt.bos_id != dft.bos_id):
        return (f"draft model bos tokens must match target model to use speculation. add: {int(tgt.add_bos)} - "
                f"{int(dft.add_bos)}, id: {tgt.bos_id} - {dft.bos_id})")
    if tgt.add_eos != dft.add_eos or (tgt.add_eos and tgt.eos_id != dft.eos_id):
        return (f"draft model eos tokens must match target model to use speculation. add: {int(tgt.add_eos)} - "
                f"{int(dft.add_eos)}, id: {tgt.eos_id} - {dft.eos_id})")
    diff = abs(tgt.n_vocab - dft.n_vocab)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (f"draft model vocab must closely match target model to use speculation but target vocab size "
                f"{tgt.n_vocab} does not match draft vocab size {dft.n_vocab} - difference {diff}, max allowed "
                f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE}")
    for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(tgt.n_vocab, dft.n_vocab)):
        if tgt.token_text(i) != dft.token_text(i):
            return (f"draft model vocab must match target model to use speculation but token {i} content differs - "
                    f"target '{tgt.piece(i).decode('utf-8', 'replace')}', draft '{dft.piece(i).decode('utf-8', 'replace')}'")
    return None


# ---- the distributions -------------------------------------------------------------------------

def rejection_eligible(st: SamplerState | None) -> bool:
    """Whether the request's sampler draws from a distribution that is a function of the row and
    its state (what the rejection rule needs): temperature > 0, no Mirostat, no XTC (a random cut),
    no reported probabilities (n_probs: the per-token path reports them), a known chain."""
    if st is None:
        return False
    p = st.params
    if p.temperature <= 0 or p.mirostat in (1, 2) or p.n_probs > 0:
        return False
    if "xtc" in p.samplers and p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5:
        return False
    return all(name in SAMPLERS for name in p.samplers)


def target_probs(row: torch.Tensor, st: SamplerState) -> torch.Tensor:
    """p: the distribution the request's sampler draws its token from at this row (logit bias,
    grammar, the whole chain, the final softmax) as a dense [V] float64 vector. `row` is not changed."""
    work = apply_bias_and_mask(row.detach().float().cpu().clone(), st)
    vals, ids = _chain(work, None, st)
    return _dense(vals, ids, row.numel())


def draft_probs(row: torch.Tensor, st: SamplerState) -> tuple[torch.Tensor, torch.Tensor]:
    """q: the request's truncation chain (no penalties, DRY, XTC, biases or grammar) over a draft
    logit row: (ids [n] int64, probs [n] float64) of the candidates left."""
    p = st.params
    vals, ids = row.detach().float().cpu(), None
    for name in p.samplers:
        if name in ("penalties", "dry", "xtc"):
            continue
        vals, ids = SAMPLERS[name](vals, ids, p, st)
    vals, ids = ensure_ids(vals, ids)
    return ids, _softmax(vals)


def _softmax(vals: torch.Tensor) -> torch.Tensor:
    if vals.numel() == 1:
        return torch.ones(1, dtype=torch.float64)
    probs = torch.softmax(vals.double(), 0)
    if not torch.isfinite(probs).all() or float(probs.sum()) <= 0:  # (the dist sampler's fallback)
        probs = torch.zeros_like(probs)
        probs[int(torch.argmax(vals))] = 1.0
    return probs


def _dense(vals: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=torch.float64)
    out[ids] = _softmax(vals)
    return out


def rejection_sample(row: torch.Tensor, st: SamplerState, tok: int, q: tuple[torch.Tensor, torch.Tensor]) -> Sampled:
    """The standard speculative rule for draft token `tok` drawn from q = (ids, probs): `tok` with
    probability min(1, p(tok) / q(tok)), else a token from norm(max(0, p - q)); p from the target's
    row through the request's sampler (`target_probs`). Random draws from the request's generator."""
    p = target_probs(row, st)
    qd = torch.zeros_like(p)
    qd[q[0]] = q[1]
    u = float(torch.rand((), generator=st.rng, dtype=torch.float64))
    if qd[tok] > 0 and u * float(qd[tok]) < float(p[tok]):
        return Sampled(tok, 0.0, [])
    resid = (p - qd).clamp_min_(0.0)
    if float(resid.sum()) <= 0.0:  # p == q up to rounding: a rejection leaves p itself
        resid = p
    return Sampled(int(torch.multinomial(resid, 1, generator=st.rng)), 0.0, [])


# ---- the draft model ----------------------------------------------------------------------------

class DraftModel:
    """The draft model with its own KV cache, per slot."""

    def __init__(self, model: Model, blocks: BlockManager, n_seq: int, params: DraftParams, n_ubatch: int,
                 n_vocab: int, path: str = ""):
        self.model, self.blocks, self.params, self.path = model, blocks, params, path
        self.n_vocab = n_vocab  # the target's: a draft token is one the target has (b1 allows 128 more or fewer)
        self.runner = ModelRunner(model, blocks, None, n_ubatch)
        self.seqs = [SeqKV() for _ in range(n_seq)]
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]  # tokens whose K/V each slot's draft cache holds

    def _sync(self, sid: int, tokens: list[int]) -> list[int]:
        """Cut slot sid's draft cache to its common prefix with `tokens`; the tokens still to feed."""
        held = self.tokens[sid]
        c = common_prefix(held, tokens)
        if c < len(held):
            self.blocks.truncate(self.seqs[sid], c)
            del held[c:]
        return tokens[c:]

    def _reserve(self, sid: int, n_total: int, busy: set[int]) -> bool:
        """Blocks for n_total tokens of slot sid's draft cache; the draft caches of slots not
        drafting now are dropped while the pool is full. False when there is still no room."""
        while True:
            try:
                self.blocks.reserve(self.seqs[sid], n_total)
                return True
            except OutOfBlocks:
                victim = next((i for i, t in enumerate(self.tokens) if t and i not in busy), None)
                if victim is None:
                    return False
                self.clear(victim)

    def clear(self, sid: int) -> None:
        self.blocks.clear(self.seqs[sid])
        self.tokens[sid] = []

    def draft(self, reqs: list[DraftRequest]) -> list[Draft]:
        """The drafts of `reqs` (b1's draft-simple over the drafting sequences, batched); a failure
        drafts nothing this step (the drafting slots' draft caches are dropped: maybe half-written)."""
        try:
            return self._draft(reqs)
        except Exception:  # noqa: BLE001 - the target decodes without a draft
            for r in reqs:
                self.clear(r.sid)
            return [Draft([]) for _ in reqs]

    def _draft(self, reqs: list[DraftRequest]) -> list[Draft]:
        out = [Draft([], [] if rejection_eligible(r.sampler) else None) for r in reqs]
        busy = {r.sid for r in reqs}
        plan = StepPlan()
        for j, r in enumerate(reqs):
            if r.n_max <= 0:
                continue
            rest = self._sync(r.sid, r.tokens) + [r.id_last]
            n_past = len(self.tokens[r.sid])
            if not self._reserve(r.sid, n_past + len(rest), busy):
                continue
            plan.batch.append(SeqBatch(self.seqs[r.sid], rest, n_past, topk=0 if out[j].q is not None else DRAFT_TOP_K))
            plan.slots.append(j)
        while plan:
            logits = self.runner.run(plan).logits[:, :self.n_vocab]  # [rows, V], one per active request
            for b, j in zip(plan.batch, plan.slots):
                self.tokens[reqs[j].sid].extend(b.tokens)
            nxt = StepPlan()
            for row, j in zip(logits, plan.slots):
                r, d = reqs[j], out[j]
                tok = self._pick(row, r, d)
                if tok is None:
                    continue
                n = min(self.params.n_max, r.n_max)
                if len(d.tokens) >= n:
                    continue
                n_past = len(self.tokens[r.sid])
                if not self._reserve(r.sid, n_past + 1, busy):
                    continue
                nxt.batch.append(SeqBatch(self.seqs[r.sid], [tok], n_past, topk=0 if d.q is not None else DRAFT_TOP_K))
                nxt.slots.append(j)
            plan = nxt
        for d in out:
            if len(d.tokens) < self.params.n_min:
                d.tokens.clear()
                if d.q is not None:
                    d.q.clear()
        return out

    def _pick(self, row: torch.Tensor, r: DraftRequest, d: Draft) -> int | None:
        """The next draft token of one row, or None when the draft stops (top probability below p_min)."""
        if d.q is None:  # b1: top-k 10, softmax over them; the most likely one
            vals, ids = torch.topk(row.float().cpu(), min(DRAFT_TOP_K, row.numel()))
            probs = torch.softmax(vals.double(), 0)
            if float(probs[0]) < self.params.p_min:
                return None
            tok = int(ids[0])
        else:
            ids, probs = draft_probs(row, r.sampler)
            if float(probs.max()) < self.params.p_min:  # decided before the draw: the kept ones are draws from q
                return None
            tok = int(ids[torch.multinomial(probs, 1, generator=r.sampler.rng)])
            d.q.append((ids, probs))
        d.tokens.append(tok)
        return tok


# ---- loading ------------------------------------------------------------------------------------

def load_draft(cfg, tokenizer, n_slots: int, n_ctx: int, log: Log) -> DraftModel | None:
    """-md FILE with --spec-type draft-simple: the draft model and its KV cache (as many tokens as the
    target's), checked against the target's vocabulary; None (logged as llama-server does) when the
    draft cannot speculate. A file that cannot be loaded is an error (llama-server exits)."""
    from runtime.model.kv_store import KVStore
    from runtime.serving import bootstrap
    from runtime.tokenizer import load_tokenizer_in_background

    spec = cfg.spec
    path = spec.draft_model
    dcfg = dataclasses.replace(cfg, model_path=path, lora=[], config_overrides={}, preload=None)
    toks = []
    try:
        lm, model = bootstrap._load_model(dcfg, log, lambda lm: toks.append(
            lm.tokenizer if lm.tokenizer is not None else load_tokenizer_in_background(lm.gguf_metadata or path)))
    except Exception as e:
        raise RuntimeError(f"failed to load draft model, '{path}': {e}") from e
    tk = toks[0].result()
    why = vocab_mismatch(tokenizer, tk)
    if why is not None:
        log("W", f"common_speculative_are_compatible: {why}")
        log("E", "common_speculative_impl_draft_simple: the target and draft vocabs are not compatible")
        log("E", f"srv    load_model: failed to initialize speculative decoding context: {INCOMPATIBLE}")
        return None
    if model.recurrent is not None:
        log("E", "srv    load_model: failed to initialize speculative decoding context: the draft model has "
                 "recurrent layers (not supported by tritium)")
        return None
    from gguf import GGMLQuantizationType
    type_k = GGMLQuantizationType[spec.draft_cache_type_k.upper()]
    type_v = GGMLQuantizationType[spec.draft_cache_type_v.upper()]
    windows = [L.window for L in model.layers]
    n_blocks = (n_ctx + cfg.block_size - 1) // cfg.block_size + n_slots
    floats = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}
    dtype = floats.get(spec.draft_cache_type_k) or floats.get(spec.draft_cache_type_v, torch.float16)
    store = KVStore(len(model.layers), model.n_head_kv, model.head_dim, n_blocks, cfg.block_size, dtype,
                    model.device, windows if any(windows) else None, 0, rope=model.key_rotation(),
                    type_k=type_k, type_v=type_v)
    log("I", f"srv    load_model: draft model '{path}': {len(model.layers)} layers, KV cache "
             f"{store.nbytes / 2**20:.2f} MiB ({n_blocks} blocks of {cfg.block_size})")
    d = DraftModel(model, BlockManager(store), n_slots, DraftParams(spec.draft_n_max, spec.draft_n_min, spec.draft_p_min),
                   bootstrap.runner_ubatch(cfg, model, lm.size), tokenizer.n_vocab, path)
    if cfg.warmup:
        seq = SeqKV()
        d.blocks.reserve(seq, 1)
        d.runner.run(StepPlan([SeqBatch(seq, [0], 0)]))
        d.blocks.clear(seq)
    return d


def make_drafter(cfg, tokenizer, n_slots: int, n_ctx: int, log: Log, recurrent: bool = False,
                 tp: bool = False) -> tuple[DraftModel | None, bool]:
    """(the draft model for -md with --spec-type draft-simple or None, whether speculation goes on):
    as llama-server b1-0c1e570, draft-simple without -md, or a draft whose vocabulary does not match,
    fails the whole speculative set-up (no type speculates); -md without draft-simple loads nothing
    that drafts (b1 loads the file, then no implementation uses it)."""
    from pathlib import Path

    from runtime.spec_config import SpecType

    spec = cfg.spec
    wanted = SpecType.DRAFT_SIMPLE in spec.types
    if not spec.draft_model:
        if wanted and not recurrent:
            log("E", "srv    load_model: failed to initialize speculative decoding context: draft-simple requires a "
                     "draft context")
            return None, False
        return None, True
    if not Path(spec.draft_model).is_file():
        raise RuntimeError(f"failed to load draft model, '{spec.draft_model}'")
    if not wanted:
        log("W", f"srv    load_model: draft model '{spec.draft_model}' is not used without --spec-type draft-simple "
                 "(as llama-server b1-0c1e570)")
        return None, True
    if recurrent:  # make_speculator said so
        return None, True
    if tp:
        log("E", "srv    load_model: failed to initialize speculative decoding context: a draft model is not "
                 "supported with tensor parallelism (-tp) in tritium")
        return None, False
    d = load_draft(cfg, tokenizer, n_slots, n_ctx, log)
    if d is not None:
        log("I", f"srv    load_model: speculative decoding: draft-simple, n_max = {d.params.n_max}, "
                 f"n_min = {d.params.n_min}, p_min = {d.params.p_min:.2f}")
    return d, d is not None

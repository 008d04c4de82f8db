"""Draft-model speculative decoding (-md FILE --spec-type draft-simple, runtime/serving/spec_draft.py):

- the rejection rule on its own: the tokens it returns are distributed as the target's p whatever the
  draft's q (a chi-square test that an accept-always rule fails);
- b1's vocabulary check;
- greedy tokens identical with and without a draft on a tiny target/draft pair (a draft of other
  weights, and the target as its own draft), several slots batched together with a slot that does
  not speculate, prompt reuse; timings draft_n / draft_n_accepted, /slots, /metrics;
- the same greedy tokens as llama-server b1-0c1e570 with the same draft (tests/data/spec_draft_greedy.json,
  recorded by scripts/record_spec_draft_reference.py), and b1's -md without --spec-type (no draft);
- temperature > 0: the distribution of the first generated tokens over many seeds is that of
  decoding without a draft (and a broken rule is caught by the same statistic);
- the server's flags, and the real Qwen2.5-Coder-0.5B Q4_K_M as its own draft.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import torch

from runtime.sampling.sampler import SamplerState
from runtime.serving import Engine, EngineConfig
from runtime.serving.spec_draft import rejection_sample, vocab_mismatch
from runtime.spec_config import SpecConfig, SpecType
from runtime.tasks import CompletionResult, CompletionTask, SamplingParams
from tests.llama_tokens import recording_script, variant_files

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "record_spec_draft_reference"  # scripts/record_spec_draft_reference.py wrote tests/data/spec_draft_greedy.json
DATA = REPO / "tests" / "data" / "spec_draft_greedy.json"


def chi2_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample chi-square test of homogeneity over the categories either sample has (counts [K])."""
    keep = (a + b) > 0
    a, b = a[keep].double(), b[keep].double()
    if a.numel() < 2:
        return 1.0
    n_a, n_b = a.sum(), b.sum()
    tot = a + b
    ea, eb = tot * n_a / (n_a + n_b), tot * n_b / (n_a + n_b)
    stat = float(((a - ea) ** 2 / ea + (b - eb) ** 2 / eb).sum())
    df = a.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


# ---- the rule on its own ------------------------------------------------------------------------

def _counts(draw, n: int, V: int) -> torch.Tensor:  # n draws
    c = torch.zeros(V)
    for _ in range(n):
        c[draw()] += 1
    return c


def test_rejection_rule_draws_from_the_target_distribution():
    V = 12
    g = torch.Generator().manual_seed(0)
    row = torch.randn(V, generator=g) * 1.5  # target logits
    q_logits = torch.randn(V, generator=g) * 1.5  # an unrelated draft
    st = SamplerState(SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=5), frozenset())
    p = torch.softmax(row.double() / 0.9, 0)
    q = torch.softmax(q_logits.double() / 0.9, 0)
    ids = torch.arange(V)

    def draw(rule):
        d = int(torch.multinomial(q, 1, generator=st.rng))
        return rule(d)

    n = 3000
    good = _counts(lambda: draw(lambda d: rejection_sample(row, st, d, (ids, q)).token), n, V)
    truth = _counts(lambda: int(torch.multinomial(p, 1, generator=st.rng)), n, V)
    assert chi2_pvalue(good, truth) > 1e-3
    assert float((good / n - p).abs().sum()) / 2 < 0.04  # total variation from p
    # the same statistic catches rules that are not the standard one: always keeping the draft, and
    # resampling from p (not from p - q) after a rejection
    always = _counts(lambda: draw(lambda d: d), n, V)
    assert chi2_pvalue(always, truth) < 1e-6

    def resample_p(d):
        u = float(torch.rand((), generator=st.rng))
        return d if u < min(1.0, float(p[d] / q[d])) else int(torch.multinomial(p, 1, generator=st.rng))
    assert chi2_pvalue(_counts(lambda: draw(resample_p), n, V), truth) < 1e-6


# ---- the vocabularies ---------------------------------------------------------------------------

def test_vocab_check_as_b1():
    from runtime.tokenizer import load_tokenizer
    from runtime.model.tiny_model import ensure_default_model

    builtin = load_tokenizer(ensure_default_model())
    assert vocab_mismatch(builtin, builtin) is None
    qwen = REPO.parent / "shared" / "vocab" / "ggml-vocab-qwen2.gguf"
    if qwen.exists():
        why = vocab_mismatch(load_tokenizer(qwen), builtin)
        assert why is not None and why.startswith("draft model")


# ---- greedy identity on the tiny pair ------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    return variant_files(SCRIPT, tmp_path_factory.mktemp("spec-draft"))


def _engine(pair, draft: str | None, n_parallel: int = 3, **kw) -> Engine:
    spec = SpecConfig()
    if draft is not None:
        spec = SpecConfig(types=(SpecType.DRAFT_SIMPLE,), draft_n_max=4, draft_model=str(pair[draft]))
    e = Engine(EngineConfig(model_path=str(pair["target"]), verbosity=0, n_ctx=512 * n_parallel, n_parallel=n_parallel,
                            kv_unified=False, warmup=False, spec=spec, **kw))
    e.load()
    e.start()
    return e


PROMPTS = [[1, 50, 300, 7, 99, 1000, 2000, 5], [17, 17, 17, 17], [900, 1800, 2700, 36, 72, 144, 288, 576, 1152]]


def _generate(e: Engine, prompts, n: int, cache_prompt: bool = False, **params) -> list[CompletionResult]:
    sp = SamplingParams(**{"temperature": 0, "ignore_eos": True, **params})
    handles = [e.submit(CompletionTask(list(p), sp, n_predict=n, cache_prompt=cache_prompt)) for p in prompts]
    out = [h.result_sync(timeout=300) for h in handles]
    assert all(isinstance(r, CompletionResult) for r in out), out
    return out


@pytest.fixture(scope="module")
def plain(pair):
    e = _engine(pair, None)
    try:
        yield {"greedy": _generate(e, PROMPTS, 40), "penalized": _generate(e, PROMPTS[:1], 30, repeat_penalty=1.3)}
    finally:
        e.stop()


@pytest.mark.parametrize("draft", ["draft", "target"])
def test_greedy_identical_with_a_draft_model(pair, plain, draft):
    e = _engine(pair, draft)
    try:
        got = _generate(e, PROMPTS, 40)
        pen = _generate(e, PROMPTS[:1], 30, repeat_penalty=1.3)
        # a slot reusing its cached prompt (and the draft's cache of it), then one whose prompt differs early
        again = _generate(e, PROMPTS[:1], 40, cache_prompt=True)
        again2 = _generate(e, PROMPTS[:1], 40, cache_prompt=True)
        other = _generate(e, [PROMPTS[0][:3] + [4, 4] + PROMPTS[0][3:]], 20, cache_prompt=True)
        slots, m = e.slots_info(), e.metrics()
    finally:
        e.stop()
    for a, b in zip(plain["greedy"], got):
        assert b.tokens == a.tokens and b.tokens_cached == a.tokens_cached and b.n_decoded == a.n_decoded
    assert pen[0].tokens == plain["penalized"][0].tokens
    assert again[0].tokens == again2[0].tokens == plain["greedy"][0].tokens
    assert other[0].n_decoded == 20
    drafted = [r.timings.draft_n for r in got]
    accepted = [r.timings.draft_n_accepted for r in got]
    assert all(d > 0 for d in drafted) and all(0 <= a <= d for a, d in zip(accepted, drafted))
    if draft == "target":  # the target as its own draft: every draft token is the target's choice
        assert accepted == drafted
        assert all(r.timings.draft_n >= 30 for r in got)  # 5 tokens a step (4 drafted), 40 tokens: 31 drafted
    assert all(s["speculative"] is True for s in slots)
    total = sum(drafted) + sum(r.timings.draft_n for r in (*pen, *again, *again2, *other))
    assert m["spec_decode_num_draft_tokens_total"] == total


def test_draft_slots_batch_with_non_speculating_ones(pair, plain):
    """Speculating slots share their forwards with a slot reading a long prompt and then decoding
    without a draft (n_predict 2: nothing left to draft after its first token); every slot's tokens
    are those it gets without a draft."""
    long_prompt = [(7 * i + 3) % 500 + 10 for i in range(300)]

    def run(e):
        hs = [e.submit(CompletionTask(list(p), SamplingParams(temperature=0, ignore_eos=True), n_predict=40,
                                      cache_prompt=False)) for p in PROMPTS]
        hs.append(e.submit(CompletionTask(long_prompt, SamplingParams(temperature=0, ignore_eos=True), n_predict=2)))
        return [h.result_sync(timeout=300) for h in hs]
    e = _engine(pair, None, n_parallel=4)
    try:
        base = run(e)
    finally:
        e.stop()
    e = _engine(pair, "draft", n_parallel=4)
    try:
        out = run(e)
    finally:
        e.stop()
    assert [r.tokens for r in out] == [r.tokens for r in base]
    assert [r.tokens for r in out[:3]] == [r.tokens for r in plain["greedy"]]
    assert out[3].n_decoded == 2 and out[3].timings.draft_n == 0 and all(r.timings.draft_n > 0 for r in out[:3])


# ---- llama-server's tokens with the same draft -------------------------------------------------

@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(DATA.read_text())


def test_recorded_files_are_these(pair, recorded):
    mod = recording_script(SCRIPT)
    for name, path in pair.items():
        assert mod.moe_ref.sha256(path) == recorded["sha256"][name], f"{name}: not the file llama-server read"


def test_greedy_tokens_as_llama_server_with_the_draft(pair, recorded):
    """scripts/record_spec_draft_reference.py: llama-server's greedy tokens with -md equal its own
    without it (b1's draft is exact for greedy); tritium's, with float32 attention as recorded, equal
    them; -md without --spec-type drafts nothing in b1 (no draft_n), and in tritium."""
    res = recorded["results"]
    for cfg in ("draft", "self", "md_only"):
        assert [r["tokens"] for r in res[cfg]] == [r["tokens"] for r in res["plain"]]
    assert all(r["draft_n"] is None for r in res["md_only"]) and all(r["draft_n"] > 0 for r in res["draft"])
    n = recorded["request"]["n_predict"]
    for cfg, draft in (("draft", "draft"), ("self", "target"), ("md_only", None)):
        spec = SpecConfig(types=(SpecType.DRAFT_SIMPLE,) if cfg != "md_only" else (), draft_n_max=4,
                          draft_model=str(pair[draft or "draft"]))
        e = Engine(EngineConfig(model_path=str(pair["target"]), verbosity=0, n_ctx=512, n_parallel=1, warmup=False,
                                kv_dtype="f32", flash_attn="off", spec=spec))
        e.load()
        e.start()
        try:
            got = [e.submit(CompletionTask(list(p), SamplingParams(temperature=0, ignore_eos=True), n_predict=n,
                                           cache_prompt=False)).result_sync(timeout=300) for p in recorded["prompts"]]
        finally:
            e.stop()
        assert [r.tokens for r in got] == [r["tokens"] for r in res[cfg]], cfg
        if cfg == "md_only":
            assert all(r.timings.draft_n == 0 for r in got)
        else:
            assert [r.timings.draft_n_accepted for r in got] == [r["draft_n_accepted"] for r in res[cfg]], cfg


# ---- temperature > 0: the distribution is unchanged ----------------------------------------------

N_SEEDS = 160
STAT_PROMPT = [1, 50, 300, 7, 99, 1000, 2000, 5]


def _first_tokens(e: Engine, n_tok: int = 4, **params) -> list[list[int]]:
    sp = [SamplingParams(**{"temperature": 1.0, "top_k": 6, "top_p": 1.0, "min_p": 0.0, "seed": 1000 + i, **params})
          for i in range(N_SEEDS)]
    hs = [e.submit(CompletionTask(list(STAT_PROMPT), p, n_predict=n_tok, cache_prompt=False)) for p in sp]
    out = [h.result_sync(timeout=300) for h in hs]
    assert all(isinstance(r, CompletionResult) and len(r.tokens) == n_tok for r in out), out[:2]
    return [r.tokens for r in out]


def _counts_of(values: list[int], V: int) -> torch.Tensor:
    c = torch.zeros(V)
    for v in values:
        c[v] += 1
    return c


def _worst_pvalue(a: list[list[int]], b: list[list[int]], V: int) -> float:
    """The smallest p-value over what a draft can change: the token at each position 1..3 (0 is
    sampled from the prompt's last row, before any draft), and how many of them repeat an earlier one."""
    def repeats(t):
        return sum(t[j] in t[:j] for j in range(1, len(t)))
    pv = [chi2_pvalue(_counts_of([t[j] for t in a], V), _counts_of([t[j] for t in b], V)) for j in range(1, 4)]
    pv.append(chi2_pvalue(_counts_of([repeats(t) for t in a], 4), _counts_of([repeats(t) for t in b], 4)))
    return min(pv)


@pytest.mark.parametrize("draft,params", [("draft", {}), ("target", {"presence_penalty": 3.0})],
                         ids=["other-draft", "self-draft-penalized"])
def test_sampled_distribution_unchanged_by_the_draft(pair, monkeypatch, draft, params):
    """Many seeds, the first four tokens: their distribution with a draft is that without it (the
    draft, the target without its second layer, is accepted part of the time; the target as its own draft with a presence
    penalty, which its q leaves out, is accepted unless the penalty bites). The control, every sampled
    draft token kept, fails the same test."""
    import runtime.serving.scheduler as sched
    e = _engine(pair, None, n_parallel=16)
    try:
        base = _first_tokens(e, **params)
        V = e.tokenizer.n_vocab
    finally:
        e.stop()
    e = _engine(pair, draft, n_parallel=16)
    try:
        spec = _first_tokens(e, **params)
        m = e.metrics()
        monkeypatch.setattr(sched, "rejection_sample", lambda row, st, tok, q: _kept(tok))
        broken = _first_tokens(e, **params)
    finally:
        e.stop()
    n_draft, n_acc = m["spec_decode_num_draft_tokens_total"], m["spec_decode_num_accepted_tokens_total"]
    assert n_draft >= 2 * N_SEEDS and 0.1 * n_draft < n_acc < n_draft, (n_draft, n_acc)
    good, bad = _worst_pvalue(spec, base, V), _worst_pvalue(broken, base, V)
    print(f"p-values: with the rule {good:.3g}, broken rule {bad:.3g}")
    assert good > 1e-4 and bad < 1e-6, (good, bad)


def _kept(tok: int):
    from runtime.sampling.sampler import Sampled
    return Sampled(tok, 0.0, [])


# ---- the server ---------------------------------------------------------------------------------

def test_server_draft_flags_timings_slots_metrics(start_server, pair):
    srv = start_server("-m", str(pair["target"]), "-md", str(pair["draft"]), "--spec-type", "draft-simple",
                       "--spec-draft-n-max", "4", "--spec-draft-p-min", "0.0", "-td", "2", "-ngld", "0", "-devd", "none",
                       "-np", "2", "-c", "1024", "--metrics")
    r = httpx.post(srv.url + "/completion", json={"prompt": PROMPTS[0], "n_predict": 24, "temperature": 0,
                                                   "ignore_eos": True}, timeout=120).json()
    t = r["timings"]
    assert r["generation_settings"]["speculative.types"] == "none,draft-simple"
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
    assert all(s["speculative"] is True for s in httpx.get(srv.url + "/slots", timeout=30).json())
    metrics = httpx.get(srv.url + "/metrics", timeout=30).text
    line = next(x for x in metrics.splitlines() if x.startswith("llamacpp:spec_decode_num_draft_tokens_total"))
    assert float(line.split()[-1]) == t["draft_n"]


def test_incompatible_or_missing_draft(pair, tmp_path):
    """b1: a draft of another vocabulary fails the speculative set-up (logged; the server serves
    without speculation, no type speculates); a draft file that cannot be loaded stops the start."""
    qwen = REPO.parent / "shared" / "vocab" / "ggml-vocab-qwen2.gguf"
    if not qwen.exists():
        pytest.skip("../shared/vocab not available")
    from runtime.model.tiny_model import spec_with, write_tiny_model
    other = write_tiny_model(tmp_path / "other-vocab.gguf", spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2,
                                                                       n_ff=128, seed=2), vocab=qwen)
    lines = []
    spec = SpecConfig(types=(SpecType.DRAFT_SIMPLE, SpecType.NGRAM_SIMPLE), draft_model=str(other))
    e = Engine(EngineConfig(model_path=str(pair["target"]), n_ctx=512, n_parallel=1, warmup=False, spec=spec,
                            log=lambda level, msg: lines.append(msg)))
    e.load()
    e.start()
    try:
        r = e.submit(CompletionTask(list(PROMPTS[0]), SamplingParams(temperature=0), n_predict=8)).result_sync(120)
        slots = e.slots_info()
    finally:
        e.stop()
    assert isinstance(r, CompletionResult) and r.timings.draft_n == 0 and slots[0]["speculative"] is False
    assert any("failed to initialize speculative decoding context: draft model vocab type must match target model "
               "to use speculation" in x for x in lines)
    e = Engine(EngineConfig(model_path=str(pair["target"]), n_ctx=512, n_parallel=1, warmup=False, verbosity=0,
                            spec=replace(spec, draft_model=str(tmp_path / "nope.gguf"))))
    with pytest.raises(RuntimeError, match="failed to load draft model"):
        e.load()


# ---- the real model -----------------------------------------------------------------------------

def test_real_qwen_as_its_own_draft_greedy_identical():
    from runtime.model.model_files import QWEN
    from tests.llama_tokens import real_model_path
    from tests.test_speculative import EDIT_PROMPT

    path = str(real_model_path(QWEN))
    out = {}
    for name, spec in (("plain", SpecConfig()),
                       ("draft", SpecConfig(types=(SpecType.DRAFT_SIMPLE,), draft_n_max=4, draft_model=path))):
        e = Engine(EngineConfig(model_path=path, verbosity=0, n_ctx=512, n_parallel=1, warmup=False, spec=spec))
        e.load()
        e.start()
        try:
            ids = e.tokenizer.encode(EDIT_PROMPT, add_special=False, parse_special=True)
            out[name] = e.submit(CompletionTask(ids, SamplingParams(temperature=0), n_predict=24)).result_sync(600)
        finally:
            e.stop()
    a, b = out["plain"], out["draft"]
    assert isinstance(a, CompletionResult) and isinstance(b, CompletionResult)
    assert b.tokens == a.tokens and len(a.tokens) == 24
    assert b.timings.draft_n_accepted == b.timings.draft_n >= 15  # 4 drafted per 5 tokens after the first

"""The sampler chain: greedy, penalties, top-k/p, min-p, bias, seeds, grammar masks, batches."""
from __future__ import annotations

import math

import pytest
import torch

from runtime.sampling.sampler import SamplerState, sample_batch, sample_row
from runtime.tasks import SamplingParams

EOG = frozenset({9})


def _st(**kw):
    return SamplerState(SamplingParams(**kw), EOG)


def test_greedy_is_argmax_and_bias_applies():
    row = torch.tensor([0.0, 3.0, 1.0, 2.9, 0, 0, 0, 0, 0, 0])
    assert sample_row(row.clone(), _st(temperature=0)).token == 1
    assert sample_row(row.clone(), _st(temperature=0, logit_bias=[(3, 1.0)])).token == 3
    assert sample_row(row.clone(), _st(temperature=0, logit_bias=[(1, float("-inf"))])).token == 3


def test_repeat_penalty_uses_history():
    row = torch.tensor([0.0, 3.0, 2.9, 0, 0, 0, 0, 0, 0, 0])
    st = _st(temperature=0, repeat_penalty=1.5, repeat_last_n=64)
    st.history.extend([1, 1])
    assert sample_row(row.clone(), st).token == 2
    st = _st(temperature=0, presence_penalty=0.5)
    st.history.append(1)
    assert sample_row(row.clone(), st).token == 2


def test_ignore_eos_bans_end_of_generation():
    row = torch.zeros(10)
    row[9] = 10.0
    assert sample_row(row.clone(), _st(temperature=0)).token == 9
    assert sample_row(row.clone(), _st(temperature=0, ignore_eos=True)).token != 9


def test_top_k_1_and_min_p_restrict_candidates():
    g = torch.Generator().manual_seed(0)
    row = torch.randn(50, generator=g)
    best = int(row.argmax())
    for seed in range(20):
        assert sample_row(row.clone(), _st(temperature=1.0, top_k=1, seed=seed)).token == best
    # min_p 0.99 keeps only tokens within 1% of the best probability
    for seed in range(20):
        assert sample_row(row.clone(), _st(temperature=1.0, top_k=0, top_p=1.0, min_p=0.99, seed=seed)).token == best


def test_top_p_keeps_the_nucleus():
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05] + [1e-9] * 6))
    seen = {sample_row(row.clone(), _st(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=s)).token for s in range(60)}
    assert seen <= {0, 1} and seen == {0, 1}


def test_seed_makes_sampling_reproducible():
    row = torch.randn(100)
    a = [sample_row(row.clone(), _st(temperature=1.5, top_k=0, min_p=0.0, seed=123)).token for _ in range(5)]
    b = [sample_row(row.clone(), _st(temperature=1.5, top_k=0, min_p=0.0, seed=123)).token for _ in range(5)]
    assert a == b
    st = _st(temperature=1.5, top_k=0, min_p=0.0, seed=7)
    seq = [sample_row(row.clone(), st).token for _ in range(30)]
    assert len(set(seq)) > 3  # really samples


def test_n_probs_reports_top_candidates():
    row = torch.tensor([1.0, 4.0, 3.0, 0, 0, 0, 0, 0, 0, 0])
    r = sample_row(row.clone(), _st(temperature=0, n_probs=2))
    assert [t for t, _ in r.top] == [1, 2]
    expect = torch.softmax(row.double(), 0)[[1, 2]]
    assert torch.allclose(torch.tensor([lp for _, lp in r.top]).double().exp(), expect, atol=1e-5)


class _OnlyEven:
    """A stand-in matcher allowing even token ids."""
    def __init__(self, n):
        self.mask = torch.tensor([i % 2 == 0 for i in range(n)])
        self.seen = []

    def allowed_mask(self):
        return self.mask

    def advance(self, t):
        assert self.mask[t]
        self.seen.append(t)


def test_n_probs_are_the_models_distribution_unless_post_sampling():
    """llama-server's n_probs / logprobs come from the raw logits (get_token_probabilities), before
    logit biases, ignore_eos and the grammar; post_sampling_probs gives the sampler's candidates."""
    row = torch.tensor([1.0, 4.0, 3.0, 2.0, 0, 0, 0, 0, 0, 5.0])
    raw = torch.log_softmax(row.double(), 0)
    for kw in ({"logit_bias": [(1, float("-inf"))]}, {"ignore_eos": True}, {}):
        st = _st(temperature=0, n_probs=2, **kw)
        st.grammar = _OnlyEven(10)
        r = sample_row(row.clone(), st)
        assert r.token == 2  # the grammar (and the bias) still decide the token
        assert [t for t, _ in r.top] == [9, 1]  # a banned and an odd token are reported, as the reference
        assert abs(r.logprob - float(raw[2])) < 1e-5
        assert torch.allclose(torch.tensor([lp for _, lp in r.top]).double(), raw[[9, 1]], atol=1e-5)
    # post_sampling_probs: what the chain left, as llama-server's populate_token_probs reports it;
    # greedy leaves one candidate (probability 1; b1 drops the zero-probability rest)
    st = _st(temperature=0, n_probs=2, post_sampling_probs=True)
    st.grammar = _OnlyEven(10)
    r = sample_row(row.clone(), st)
    assert (r.token, r.logprob, r.top) == (2, 0.0, [(2, 0.0)])


def test_post_sampling_probs_are_the_drawn_distribution():
    """With top_k 3 and temperature 0.5 the draw is from softmax(logits / 0.5) over the three best
    (b1: top_k, temperature, then dist's softmax): those probabilities, most likely first."""
    row = torch.tensor([1.0, 4.0, 3.0, 2.0, 0, 0, 0, 0, 0, 5.0])
    st = _st(temperature=0.5, top_k=3, top_p=1.0, min_p=0.0, n_probs=5, post_sampling_probs=True, seed=3)
    r = sample_row(row.clone(), st)
    expect = torch.softmax(torch.tensor([5.0, 4.0, 3.0], dtype=torch.float64) / 0.5, 0)
    assert [t for t, _ in r.top] == [9, 1, 2]  # three candidates only, though five were asked for
    assert torch.allclose(torch.tensor([lp for _, lp in r.top], dtype=torch.float64).exp(), expect, atol=1e-6)
    assert r.token in (9, 1, 2) and abs(math.exp(r.logprob) - float(expect[[9, 1, 2].index(r.token)])) < 1e-6


def test_grammar_mask_and_batch_mixing():
    rows = torch.randn(3, 10)
    rows[:, 1] = 50.0  # an odd token dominates
    plain = _st(temperature=0)
    constrained = _st(temperature=0)
    constrained.grammar = _OnlyEven(10)
    sampled = _st(temperature=0.7, seed=1)
    out = sample_batch(rows.clone(), [plain, constrained, sampled])
    assert out[0].token == 1
    assert out[1].token % 2 == 0
    constrained.accept(out[1].token)
    assert constrained.grammar.seen == [out[1].token]
    assert out[2].token == 1


def test_top_n_sigma_keeps_tokens_near_the_max():
    row = torch.zeros(10)
    row[3], row[5] = 10.0, 9.9
    seen = {sample_row(row.clone(), _st(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, top_n_sigma=1.0, seed=s)).token
            for s in range(40)}
    assert seen == {3, 5}


def test_typical_p_drops_atypical_tokens():
    # one likelier token among ten equal ones: its information content (-log p = 1.2) is far from
    # the entropy (2.22) while the others' (2.66) is close, so it is the atypical one
    row = torch.log(torch.tensor([0.3] + [0.07] * 10))
    seen = {sample_row(row.clone(), _st(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=0.5, seed=s)).token
            for s in range(40)}
    assert 0 not in seen and len(seen) > 1


def test_xtc_removes_the_top_choices():
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05] + [1e-6] * 6))
    p = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.1)
    seen = {sample_row(row.clone(), _st(seed=s, **p)).token for s in range(60)}
    assert 0 not in seen and 1 not in seen and 2 in seen  # all above the threshold but the least likely go


def test_dry_penalises_continuing_a_repeat():
    row = torch.zeros(10)
    row[4] = 1.0  # 4 would win without DRY
    st = _st(temperature=0, dry_multiplier=2.0, dry_base=1.75, dry_allowed_length=2)
    st.history.extend([1, 2, 3, 4, 5, 1, 2, 3])  # "1 2 3" repeats; last time it was followed by 4
    assert sample_row(row.clone(), st).token != 4
    st2 = _st(temperature=0, dry_multiplier=2.0, dry_base=1.75, dry_allowed_length=2)
    st2.history.extend([7, 8, 9, 6, 5, 1, 2, 3])  # no repeat: 4 stays the best
    assert sample_row(row.clone(), st2).token == 4


def test_samplers_order_is_respected():
    row = torch.log(torch.tensor([0.4, 0.35, 0.25] + [1e-9] * 7))
    # temperature first (very sharp) then min_p keeps only the best; min_p first keeps three
    sharp_first = _st(temperature=0.05, top_k=0, top_p=1.0, min_p=0.5, samplers=["temperature", "min_p"], seed=0)
    assert {sample_row(row.clone(), sharp_first).token for _ in range(20)} == {0}


def test_topk_first_rows_sample_from_candidates_like_the_full_row():
    """Rows whose chain starts with top_k are sampled from their k candidates (numpy selection on
    the CPU, one batched top-k on a device): with the same seed, the same tokens as `sample_row`
    over the whole row, ignore_eos and min_keep included."""
    import random
    from runtime.sampling.sampler import topk_needed
    V = 5000
    for trial in range(30):
        params = SamplingParams(temperature=random.choice([0.5, 1.0, 1.5]), top_k=random.choice([5, 40]),
                                top_p=random.choice([0.9, 1.0]), min_p=random.choice([0.0, 0.05]),
                                min_keep=random.choice([0, 50]), ignore_eos=trial % 2 == 0, seed=1000 + trial)
        rows = torch.randn(3, V) * 3
        rows[:, 7] = 30.0  # an EOG token that ignore_eos must ban
        want = [sample_row(rows[i].clone(), SamplerState(params, frozenset({7}))).token for i in range(3)]
        states = [SamplerState(params, frozenset({7})) for _ in range(3)]
        assert topk_needed(states[0])[0] == params.top_k  # llama.cpp's top_k ignores min_keep
        got = [s.token for s in sample_batch(rows.clone(), states)]
        assert got == want
        if params.ignore_eos:
            assert 7 not in got


def test_topk_rows_batched_and_per_row_agree():
    from runtime.sampling.sampler import topk_rows
    with torch.inference_mode():  # as the model's logits are
        rows = torch.randn(4, 3000)
    picks = [(0, 5, ()), (2, 40, (int(rows[2].argmax()),)), (3, 1, ())]
    before = rows.clone()
    a = topk_rows(rows, picks, batched=True)
    b = topk_rows(rows, picks, batched=False)
    assert torch.equal(rows, before)  # banned entries restored
    for (i, k, banned), (va, ia), (vb, ib) in zip(picks, a, b):
        assert torch.equal(va, vb) and torch.equal(ia, ib) and len(ia) == k
        assert not set(banned) & set(ia.tolist())
        assert torch.equal(va, torch.topk(rows[i].index_fill(0, torch.tensor(list(banned), dtype=torch.long),
                                                               float("-inf")) if banned else rows[i], k).values)


def test_topk_shortcut_survives_ignore_eos_and_ban_biases():
    """ignore_eos arrives as -inf logit biases on the EOG tokens (as llama-server echoes them): those
    and other -inf biases only ban tokens, so a greedy row still needs only its top-1 (the output
    head's shortcut); a finite bias can promote any token, so then the whole row is needed."""
    from runtime.sampling.sampler import topk_needed
    inf = float("-inf")
    eog = frozenset({7, 9})
    plain = SamplerState(SamplingParams(temperature=0.0, ignore_eos=True, logit_bias=[(7, inf), (9, inf)]), eog)
    assert topk_needed(plain) == (1, (7, 9))
    banned = SamplerState(SamplingParams(temperature=0.0, logit_bias=[(3, inf), (5, 0.0)]), eog)
    assert topk_needed(banned) == (1, (3,))
    promoted = SamplerState(SamplingParams(temperature=0.0, ignore_eos=True, logit_bias=[(7, inf), (4, 2.5)]), eog)
    assert topk_needed(promoted) == (0, ())
    # and the sampled token is the same as over the full row
    rows = torch.randn(2, 500)
    rows[:, 7] = 50.0
    rows[:, 3] = 40.0
    for st in (plain, banned):
        want = sample_row(rows[0].clone(), st).token
        got = sample_batch(rows[:1].clone(), [st])[0].token
        assert got == want and got not in topk_needed(st)[1]


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_follows_its_target_surprise(version):
    """Mirostat (1) and Mirostat 2.0 (2), llama.cpp's samplers: a tiny target surprise keeps only
    the most likely token (and mu grows by eta * tau per draw, the draw's surprise being 0); a large
    one samples widely."""
    row = torch.tensor([3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
    st = _st(temperature=1.0, mirostat=version, mirostat_tau=0.01, mirostat_eta=0.1, seed=5)
    assert st.mu == pytest.approx(0.02)
    assert {sample_row(row.clone(), st).token for _ in range(30)} == {0}
    if version == 2:
        assert st.mu == pytest.approx(0.02 + 30 * 0.1 * 0.01)
    st = _st(temperature=1.0, mirostat=version, mirostat_tau=12.0, seed=5)
    assert len({sample_row(row.clone(), st).token for _ in range(200)}) >= 5
    # the whole row is needed: no top-k shortcut
    from runtime.sampling.sampler import topk_needed
    assert topk_needed(st) == (0, ())

"""Torch reference ops (the CPU engine's hot path) against float64 oracles."""
import math

import pytest
import torch

import kernels
from kernels import ref
from kernels.testing import (
    FLOAT_QTYPES,
    QUANT_TYPES,
    attention_oracle,
    dequant_oracle,
    make_paged_case,
    random_qweight,
    rel_err,
    rms_norm_oracle,
    rope_oracle,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_QTYPES, ids=lambda q: q.name)
def test_dequantize_qmatmul_embedding(qtype):
    cols = 512 if qtype.name.endswith("_K") else 96
    w = random_qweight(qtype, 7, cols)
    want_w = dequant_oracle(w)
    assert rel_err(ref.dequantize(w, torch.float32), want_w) < 1e-6
    x = torch.randn(5, cols)
    assert rel_err(ref.qmatmul(x, w), x.double() @ want_w.T) < 1e-5
    ids = torch.tensor([6, 0, 3, 3])
    emb = ref.embedding(ids, w)
    assert emb.dtype == torch.float32 and rel_err(emb, want_w[ids]) < 1e-6


def test_qmatmul_chunked_rows(monkeypatch):
    monkeypatch.setattr(ref, "_QMATMUL_CHUNK_ELEMS", 3 * 256)  # 3 rows per dequantized chunk
    w = random_qweight(kernels.testing.Q.Q4_K, 10, 256)
    x = torch.randn(2, 256)
    assert rel_err(ref.qmatmul(x, w), x.double() @ dequant_oracle(w).T) < 1e-5


def test_qmatmul_float_weight_dtype():
    w = random_qweight(kernels.testing.Q.F16, 9, 33)
    x = torch.randn(4, 33)
    y = ref.qmatmul(x, w)
    assert y.dtype == torch.float32
    assert rel_err(y, x.double() @ w.data.double().T) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm(dtype):
    x = torch.randn(5, 67).to(dtype)
    r = torch.randn(5, 67).to(dtype)
    wt = torch.randn(67)
    assert rel_err(ref.rms_norm(x, wt, 1e-6), rms_norm_oracle(x, wt, 1e-6)) < TOL[dtype]
    normed, s = ref.add_rms_norm(x, r, wt, 1e-5)
    assert s.dtype == dtype and normed.dtype == dtype
    assert rel_err(s, x.double() + r.double()) < TOL[dtype]
    assert rel_err(normed, rms_norm_oracle(s, wt, 1e-5)) < TOL[dtype]


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("partial", [False, True])
def test_rope(neox, partial):
    T, NH, D = 6, 3, 16
    R = 4 if partial else D // 2
    x = torch.randn(T, NH, D)
    pos = torch.randint(0, 5000, (T,))
    inv_freq = 1.0 / (10000 ** (torch.arange(R, dtype=torch.float32) * 2 / D))
    y = ref.rope(x, pos, inv_freq, neox)
    # float32 angles of positions up to 5000: compare against an oracle fed the same float32 angles
    assert rel_err(y, rope_oracle(x, pos, inv_freq, neox)) < 1e-5
    # rotating by a delta and back is the identity; rotating twice by d equals once by 2d
    d = torch.randint(-40, 40, (T,))
    twice = ref.rope(ref.rope(x, d, inv_freq, neox), d, inv_freq, neox)
    assert rel_err(twice, ref.rope(x, 2 * d, inv_freq, neox)) < 1e-5
    assert rel_err(ref.rope(ref.rope(x, d, inv_freq, neox), -d, inv_freq, neox), x) < 1e-5


def test_silu_mul():
    g, u = torch.randn(3, 50), torch.randn(3, 50)
    want = g.double() * torch.sigmoid(g.double()) * u.double()
    assert rel_err(ref.silu_mul(g, u), want) < 1e-6
    assert rel_err(ref.silu_mul(g.half(), u.half()), want) < 2e-3


def test_write_kv():
    NB, BS, KVH, D = 5, 4, 2, 8
    kc = torch.full((NB, BS, KVH, D), float("nan"), dtype=torch.float16)
    vc = kc.clone()
    slots = torch.tensor([17, 3, -1, 8])
    k, v = torch.randn(4, KVH, D), torch.randn(4, KVH, D)
    ref.write_kv(k, v, kc, vc, slots)
    for i, sl in enumerate(slots.tolist()):
        if sl < 0:
            continue
        assert torch.equal(kc[sl // BS, sl % BS], k[i].half())
        assert torch.equal(vc[sl // BS, sl % BS], v[i].half())
    assert int(torch.isnan(kc).flatten(0, 1).all(-1).all(-1).logical_not().sum()) == 3


ATTN_CASES = {
    "decode_batch": ([1, 1, 1], [1, 37, 16]),
    "prefill_fresh": ([9], [9]),
    "prefill_with_prefix": ([5, 3], [21, 40]),
    "mixed": ([1, 7, 1, 0], [50, 7, 3, 12]),
}


@pytest.mark.parametrize("case_name", list(ATTN_CASES))
@pytest.mark.parametrize("softcap", [0.0, 20.0])
@pytest.mark.parametrize("H,KVH", [(4, 2), (3, 3)])
def test_paged_attention(case_name, softcap, H, KVH):
    q_lens, kv_lens = ATTN_CASES[case_name]
    D, BS = 16, 4
    case = make_paged_case(q_lens, kv_lens, H, KVH, D, BS, dtype=torch.float16)
    scale = 1.0 / math.sqrt(D) * (4.0 if softcap else 1.0)  # large scores make the cap matter
    want = attention_oracle(case, scale, softcap)
    got = ref.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                              case.cu_seqlens_q, case.kv_lens, scale, softcap)
    assert got.dtype == torch.float16 and got.shape == case.q.shape
    assert rel_err(got, want) < 2e-3


def test_paged_attention_unbatched_decode_path(monkeypatch):
    monkeypatch.setattr(ref, "_BATCHED_DECODE_MAX_ELEMS", 0)
    case = make_paged_case([1, 1], [30, 5], 4, 1, 8, 4, dtype=torch.float32)
    want = attention_oracle(case, 0.3)
    got = ref.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                              case.cu_seqlens_q, case.kv_lens, 0.3)
    assert rel_err(got, want) < 1e-5


def test_dispatch_object_and_module_functions():
    assert kernels.Ops("torch").impl(torch.device("cpu")) is ref
    assert kernels.Ops("auto").impl(torch.device("cpu")) is ref
    with pytest.raises(ValueError):
        kernels.Ops("cuda")
    x = torch.randn(2, 8)
    wt = torch.ones(8)
    assert rel_err(kernels.rms_norm(x, wt, 1e-6), rms_norm_oracle(x, wt, 1e-6)) < 1e-6

"""The torch reference ops (`kernels.ref`, the "torch" backend) against float64 oracles, and the
dispatch by device."""
import math

import pytest
import torch

import kernels
from kernels import ref
from tests.kernel_oracles import (
    FLOAT_QTYPES,
    QUANT_TYPES,
    Q,
    attention_oracle,
    dequant_oracle,
    make_paged_case,
    random_qweight,
    rel_err,
    rms_norm_oracle,
    rope_oracle,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# the ops on GGUF-layout weights and paged caches, through the reference and through the CPU
# backend (its C / BLAS / batched paths where they apply, the reference otherwise)
BACKENDS = ["torch", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_QTYPES, ids=lambda q: q.name)
def test_dequantize_qmatmul_embedding(qtype, backend):
    ops = kernels.Backend(backend)
    cols = 512 if qtype.name.endswith("_K") else 96
    w = random_qweight(qtype, 7, cols)
    want_w = dequant_oracle(w)
    assert rel_err(ops.dequantize(w, torch.float32), want_w) < 1e-6
    x = torch.randn(5, cols)
    assert rel_err(ops.qmatmul(x, w), x.double() @ want_w.T) < 1e-5
    ids = torch.tensor([6, 0, 3, 3])
    emb = ops.embedding(ids, w)
    assert emb.dtype == torch.float32 and rel_err(emb, want_w[ids]) < 1e-6


def test_qmatmul_chunked_rows(monkeypatch):
    monkeypatch.setattr(ref, "_QMATMUL_CHUNK_ELEMS", 3 * 256)  # 3 rows per dequantized chunk
    w = random_qweight(Q.Q4_K, 10, 256)
    x = torch.randn(2, 256)
    assert rel_err(ref.qmatmul(x, w), x.double() @ dequant_oracle(w).T) < 1e-5


def test_qmatmul_float_weight_dtype():
    w = random_qweight(Q.F16, 9, 33)
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_name", list(ATTN_CASES))
@pytest.mark.parametrize("softcap", [0.0, 20.0])
@pytest.mark.parametrize("H,KVH", [(4, 2), (3, 3)])
def test_paged_attention(case_name, softcap, H, KVH, backend):
    q_lens, kv_lens = ATTN_CASES[case_name]
    D, BS = 16, 4
    case = make_paged_case(q_lens, kv_lens, H, KVH, D, BS, dtype=torch.float16)
    scale = 1.0 / math.sqrt(D) * (4.0 if softcap else 1.0)  # large scores make the cap matter
    want = attention_oracle(case, scale, softcap)
    got = kernels.Backend(backend).paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                                   case.cu_seqlens_q, case.kv_lens, scale, softcap)
    assert got.dtype == torch.float16 and got.shape == case.q.shape
    assert rel_err(got, want) < 2e-3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_name", list(ATTN_CASES))
@pytest.mark.parametrize("window,softcap", [(3, 0.0), (8, 0.0), (6, 20.0)])
def test_paged_attention_sliding_window(case_name, window, softcap, backend):
    q_lens, kv_lens = ATTN_CASES[case_name]
    case = make_paged_case(q_lens, kv_lens, 4, 2, 16, 4, dtype=torch.float16)
    scale = 0.25 * (4.0 if softcap else 1.0)
    want = attention_oracle(case, scale, softcap, window)
    got = kernels.Backend(backend).paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                                   case.cu_seqlens_q, case.kv_lens, scale, softcap, window=window)
    assert rel_err(got, want) < 2e-3


def test_reference_reads_only_gguf_rows():
    w = random_qweight(Q.F32, 300, 256)
    tiles = kernels.Backend("cpu").prepare_weight(w)
    assert tiles.layout != "rows"
    with pytest.raises(ValueError, match="CPU backend"):
        ref.qmatmul(torch.randn(1, 256), tiles)


def test_topk_ops():
    row = torch.randn(5000)
    v, i = ref.topk(row, 7)
    assert torch.equal(v, torch.topk(row, 7).values) and torch.equal(row[i], v)
    w = random_qweight(Q.F32, 40, 32)
    assert ref.prepare_topk_head(w) is None
    x = torch.randn(3, 32)
    assert torch.equal(ref.topk_logits(x, w, None, [0, 5, 1], [(), (1, 2), ()]), ref.qmatmul(x, w))


def test_dispatch_by_device():
    from kernels import cpu

    cpu_b = kernels.Backend.for_device("cpu")
    assert cpu_b.name == "cpu" and cpu_b.qmatmul is cpu.qmatmul and cpu_b.silu_mul is cpu.silu_mul
    assert cpu_b.dense_attention is ref.dense_attention  # ops the CPU backend takes from the reference as they are
    assert cpu_b.moe_route is cpu.moe_route  # its own: gpt-oss's softmax after the top k in llama.cpp's order
    assert cpu_b.gelu_mul is cpu.gelu_mul
    # the ops whose arithmetic depends on the numerics carry the backend's, fixed when it was built
    assert cpu_b.numerics is kernels.Numerics.GGML
    for op in cpu.NUMERICS_OPS:
        fn = getattr(cpu_b, op)
        assert fn.func is getattr(cpu, op) and fn.keywords == {"numerics": kernels.Numerics.GGML}, op
    assert kernels.Backend.for_device(torch.device("cpu"), "auto") is cpu_b  # one instance per name
    assert kernels.Backend.for_device("cpu", numerics="ggml") is cpu_b
    own = kernels.Backend.for_device("cpu", "cpu", kernels.Numerics.OWN)  # and per numerics
    assert own is not cpu_b and own.numerics is kernels.Numerics.OWN and own.qmatmul is cpu.qmatmul
    assert own.paged_attention.keywords == {"numerics": kernels.Numerics.OWN}
    assert own is kernels.Backend.for_device("cpu", numerics="own")
    torch_b = kernels.Backend.for_device("cpu", "torch")
    assert torch_b.name == "torch" and torch_b.paged_attention is ref.paged_attention
    assert not torch_b.packs_quantized()
    assert kernels.Backend("cpu").topk is cpu.topk and kernels.Backend("cpu").topk_logits is cpu.topk_logits
    with pytest.raises(ValueError):
        kernels.Backend("cuda")
    with pytest.raises(AttributeError):
        cpu_b.qmatmul = ref.qmatmul  # immutable: no global switch to flip
    x = torch.randn(2, 8)
    wt = torch.ones(8)
    assert rel_err(kernels.rms_norm(x, wt, 1e-6), rms_norm_oracle(x, wt, 1e-6)) < 1e-6
    for op in kernels.OPS:  # every backend has every op
        assert callable(getattr(cpu_b, op)) and callable(getattr(torch_b, op)) and callable(getattr(kernels, op))

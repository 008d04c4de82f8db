"""Triton kernels vs float64 oracles. On CPU they run in the Triton interpreter
(TRITON_INTERPRET=1, set here before triton is imported); on a CUDA machine with
TRITIUM_KERNEL_DEVICE=cuda (scripts/gpu_check.sh) the same tests run natively on the GPU.

Every output buffer the kernels allocate is NaN-poisoned first, inputs are fresh random each run
(the seed is printed on failure), sizes are odd on purpose."""
import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math
import random

import pytest
import torch

import kernels
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

DEV = os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu")
if DEV == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 before triton is imported",
                allow_module_level=True)
if DEV == "cuda" and not torch.cuda.is_available():
    pytest.skip("TRITIUM_KERNEL_DEVICE=cuda without a GPU", allow_module_level=True)

OPS = kernels.Backend("triton")
# fp32 matmuls/dots run on TF32 tensor cores on a GPU; the interpreter is exact float32.
F32_TOL = 1e-5 if DEV == "cpu" else 3e-3
TOL = {torch.float32: F32_TOL, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def fresh_seed():
    seed = random.SystemRandom().randrange(2**31)
    print(f"seed={seed}")
    torch.manual_seed(seed)
    yield


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every torch.empty/empty_like during the test returns NaN (floats) / -1 (ints)."""
    real_empty, real_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-1)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_like(*a, **k)))


def dev(t):
    return t.to(DEV)


def qw_dev(w):
    return w.to(DEV)


@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_QTYPES, ids=lambda q: q.name)
def test_dequantize_and_embedding(qtype):
    cols = 512 if qtype.name.endswith("_K") else 160
    w = random_qweight(qtype, 13, cols)
    want = dequant_oracle(w)
    wd = qw_dev(w)
    assert rel_err(OPS.dequantize(wd, torch.float32), want) == 0.0  # exact: same float32 math
    assert rel_err(OPS.dequantize(wd, torch.float16), want) < 1e-3
    ids = torch.tensor([12, 0, 5, 5, 1])
    emb = OPS.embedding(dev(ids), wd)
    assert emb.dtype == torch.float32
    assert rel_err(emb, want[ids]) == 0.0


@pytest.mark.parametrize("M", [1, 5, 16, 37])  # GEMV (pow2 and not), tiled (ragged)
@pytest.mark.parametrize("qtype", QUANT_TYPES + FLOAT_QTYPES, ids=lambda q: q.name)
def test_qmatmul(qtype, M):
    cols = 512 if qtype.name.endswith("_K") else 96
    N = 23
    w = random_qweight(qtype, N, cols)
    want_w = dequant_oracle(w)
    xbig = torch.randn(M, cols + 8)
    x = dev(xbig)[:, 3 : 3 + cols]  # non-contiguous rows
    y = OPS.qmatmul(x, qw_dev(w))
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert rel_err(y, xbig[:, 3 : 3 + cols].double() @ want_w.T) < F32_TOL


@pytest.mark.parametrize("M", [3, 40])
@pytest.mark.parametrize("xdtype", [torch.float16, torch.bfloat16])
def test_qmatmul_half_activations(M, xdtype):
    w = random_qweight(Q.Q4_K, 30, 256)
    x = torch.randn(M, 256).to(xdtype)
    y = OPS.qmatmul(dev(x), qw_dev(w))
    assert y.dtype == xdtype
    # the tiled path rounds the dequantized weight to x.dtype before tl.dot
    assert rel_err(y, x.double() @ dequant_oracle(w).T) < 2 * TOL[xdtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("C", [67, 128])
def test_rms_norm(dtype, C):
    x = torch.randn(5, C).to(dtype)
    r = torch.randn(5, C).to(dtype)
    w = torch.randn(C)
    got = OPS.rms_norm(dev(x), dev(w), 1e-6)
    assert got.dtype == dtype and rel_err(got, rms_norm_oracle(x, w, 1e-6)) < TOL[dtype]
    normed, s = OPS.add_rms_norm(dev(x), dev(r), dev(w), 1e-5)
    assert rel_err(s, x.double() + r.double()) < TOL[dtype]
    assert rel_err(normed, rms_norm_oracle(s.cpu(), w, 1e-5)) < TOL[dtype]


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("D,R", [(16, 8), (24, 4)])  # full, partial rotary with odd head dim
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope(neox, D, R, dtype):
    T, NH = 7, 3
    x = torch.randn(T, NH + 2, D).to(dtype)[:, 1 : 1 + NH]  # non-contiguous heads
    pos = torch.randint(-64, 4000, (T,))  # negative = deltas
    inv_freq = 1.0 / (10000 ** (torch.arange(R, dtype=torch.float32) * 2 / D))
    got = OPS.rope(dev(x), dev(pos), dev(inv_freq), neox)
    tol = 2e-5 if dtype == torch.float32 and DEV == "cpu" else (1e-4 if dtype == torch.float32 else 2e-3)
    assert got.shape == x.shape and rel_err(got, rope_oracle(x, pos, inv_freq, neox)) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul(dtype):
    gu = torch.randn(4, 2 * 1100).to(dtype)  # F = 1100 > one 1024 block
    g, u = gu[:, :1100], gu[:, 1100:]
    want = g.double() * torch.sigmoid(g.double()) * u.double()
    assert rel_err(OPS.silu_mul(dev(g), dev(u)), want) < (1e-6 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float32])
def test_write_kv(cache_dtype):
    NB, BS, KVH, D = 6, 4, 3, 12
    kc = dev(torch.full((NB, BS, KVH, D), float("nan"), dtype=cache_dtype))
    vc = kc.clone()
    qkv = torch.randn(5, (4 + 2 * KVH) * D)  # k, v are strided slices of a fused projection
    k = qkv[:, 4 * D : (4 + KVH) * D].view(5, KVH, D)
    v = qkv[:, (4 + KVH) * D :].view(5, KVH, D)
    slots = torch.tensor([23, 0, -1, 9, 14])
    OPS.write_kv(dev(k), dev(v), kc, vc, dev(slots))
    kc, vc = kc.cpu(), vc.cpu()
    for i, sl in enumerate(slots.tolist()):
        if sl >= 0:
            assert torch.equal(kc[sl // BS, sl % BS], k[i].to(cache_dtype))
            assert torch.equal(vc[sl // BS, sl % BS], v[i].to(cache_dtype))
    written = ~torch.isnan(kc.reshape(NB * BS, -1)).all(-1)
    assert written.sum().item() == 4


ATTN_CASES = {
    "decode_one": ([1], [1]),
    "decode_batch": ([1, 1, 1], [1, 37, 16]),
    "decode_long": ([1, 1], [150, 3]),  # 38 blocks out of order
    "prefill_fresh": ([9], [9]),
    "prefill_with_prefix": ([5, 3], [21, 40]),
    "prefill_long": ([70], [95]),  # several query and key tiles
    "mixed": ([1, 7, 1, 0], [50, 7, 3, 12]),
}


@pytest.mark.parametrize("case_name", list(ATTN_CASES))
@pytest.mark.parametrize("softcap", [0.0, 20.0])
@pytest.mark.parametrize("H,KVH,D", [(4, 2, 16), (3, 3, 24)])
def test_paged_attention(case_name, softcap, H, KVH, D):
    q_lens, kv_lens = ATTN_CASES[case_name]
    case = make_paged_case(q_lens, kv_lens, H, KVH, D, 4, dtype=torch.float16)
    scale = 1.0 / math.sqrt(D) * (4.0 if softcap else 1.0)
    want = attention_oracle(case, scale, softcap)
    got = OPS.paged_attention(dev(case.q), dev(case.k_cache), dev(case.v_cache), dev(case.block_tables),
                              dev(case.cu_seqlens_q), dev(case.kv_lens), scale, softcap)
    assert got.dtype == torch.float16 and got.shape == case.q.shape
    assert rel_err(got, want) < 3e-3


@pytest.mark.parametrize("case_name", ["decode_batch", "decode_long", "prefill_with_prefix", "prefill_long", "mixed"])
@pytest.mark.parametrize("window,softcap", [(5, 0.0), (33, 0.0), (16, 20.0)])
def test_paged_attention_sliding_window(case_name, window, softcap):
    q_lens, kv_lens = ATTN_CASES[case_name]
    case = make_paged_case(q_lens, kv_lens, 4, 2, 16, 4, dtype=torch.float16)
    scale = 1.0 / math.sqrt(16) * (4.0 if softcap else 1.0)
    want = attention_oracle(case, scale, softcap, window)
    got = OPS.paged_attention(dev(case.q), dev(case.k_cache), dev(case.v_cache), dev(case.block_tables),
                              dev(case.cu_seqlens_q), dev(case.kv_lens), scale, softcap, window=window)
    assert rel_err(got, want) < 3e-3
    full = attention_oracle(case, scale, softcap)
    assert rel_err(full, want) > 1e-2  # the window changes the result in these cases


@pytest.mark.parametrize("num_splits", [2, 8])
def test_paged_decode_split_k(num_splits):
    from kernels.triton.paged_decode import paged_decode

    case = make_paged_case([1, 1, 1], [200, 5, 64], 8, 2, 16, 8, dtype=torch.float32)
    out = dev(torch.full_like(case.q, float("nan")))
    got = paged_decode(dev(case.q), dev(case.k_cache), dev(case.v_cache), dev(case.block_tables),
                       dev(case.cu_seqlens_q), dev(case.kv_lens), 0.3, out=out, num_splits=num_splits)
    assert rel_err(got, attention_oracle(case, 0.3)) < F32_TOL * 10


def test_num_splits_policy():
    from kernels.triton.paged_decode import num_splits_for

    assert num_splits_for(64, 8, 512) == 1  # plenty of programs
    assert num_splits_for(1, 8, 32768) == 32  # one long sequence: split hard
    assert num_splits_for(1, 8, 300) == 1  # short context: no split
    for S in (1, 3, 8):
        n = num_splits_for(S, 4, 4096)
        assert n & (n - 1) == 0 and 1 <= n <= 16


def test_dispatch_routes_to_triton():
    from kernels import triton as triton_backend

    assert OPS.qmatmul is triton_backend.qmatmul and OPS.paged_attention is triton_backend.paged_attention
    assert kernels.Backend.for_device("cuda").name == "triton"
    assert kernels.Backend.for_device("cpu", "triton") is kernels.Backend.for_device("cuda")
    x, w = dev(torch.randn(3, 40)), dev(torch.randn(40))
    assert rel_err(OPS.rms_norm(x, w, 1e-6), rms_norm_oracle(x.cpu(), w.cpu(), 1e-6)) < F32_TOL
    if DEV == "cuda":  # the module functions choose by device
        assert rel_err(kernels.rms_norm(x, w, 1e-6), rms_norm_oracle(x.cpu(), w.cpu(), 1e-6)) < F32_TOL


@pytest.mark.parametrize("H,KVH,D", [(32, 2, 16), (8, 1, 32)])  # 16 heads per KV head: tl.dot tiles; 8: CUDA cores
def test_paged_decode_group_paths(H, KVH, D):
    case = make_paged_case([1, 1], [40, 7], H, KVH, D, 4, dtype=torch.float16)
    got = OPS.paged_attention(dev(case.q), dev(case.k_cache), dev(case.v_cache), dev(case.block_tables),
                              dev(case.cu_seqlens_q), dev(case.kv_lens), 0.25)
    assert rel_err(got, attention_oracle(case, 0.25)) < 3e-3


def test_tuner_never_tunes_while_serving_and_keeps_its_choice_on_disk(tmp_path, monkeypatch):
    """A miss outside the warm-up takes the first candidate untimed; inside `tuning()` the
    fastest is timed once and saved; a new process (a new Tuner) reads it from $TRITIUM_CACHE."""
    import types

    import triton

    from kernels.triton import tuning

    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU 80GB")
    speed = {"a": 3.0, "b": 1.0, "c": 2.0}
    timed = []

    def fastest(cands, run):
        timed.append([c.kwargs["n"] for c in cands])
        return min(cands, key=lambda c: speed[c.kwargs["n"]])

    monkeypatch.setattr(tuning, "_fastest", fastest)
    cfgs = [triton.Config({"n": n}) for n in "abc"]
    gpu = types.SimpleNamespace(type="cuda")
    ran = []
    t = tuning.Tuner("test", cfgs)
    assert t.launch((64, 4096), {}, gpu, lambda c: ran.append(c.kwargs["n"])).kwargs["n"] == "a"
    assert (t.misses, timed) == (1, [])
    with tuning.tuning():
        assert t.launch((64, 4096), {}, gpu, lambda c: ran.append(c.kwargs["n"])).kwargs["n"] == "b"
        assert t.launch((64, 4096), {}, gpu, lambda c: ran.append(c.kwargs["n"])).kwargs["n"] == "b"
    assert timed == [["a", "b", "c"]] and ran == ["a", "b", "b"]
    assert list((tmp_path / "triton-tune").glob("test-Fake_GPU_80GB-*.json"))
    fresh = tuning.Tuner("test", cfgs)
    assert fresh.launch((64, 4096), {}, gpu, lambda c: None).kwargs["n"] == "b"
    assert (fresh.misses, fresh.timed, len(timed)) == (0, 0, 1)
    other = tuning.Tuner("test", cfgs[::-1])  # another config list: another table
    assert other.launch((64, 4096), {}, gpu, lambda c: None).kwargs["n"] == "c"
    # pruned to one candidate, or not on a GPU: nothing to choose
    one = tuning.Tuner("test1", cfgs, prune=lambda cs, meta: cs[2:])
    with tuning.tuning():
        assert one.launch((1,), {}, gpu, lambda c: None).kwargs["n"] == "c"
        assert t.launch((9,), {}, torch.device("cpu"), lambda c: None).kwargs["n"] == "a"
    assert len(timed) == 1

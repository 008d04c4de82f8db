"""Triton kernels vs float64 oracles. On CPU they run in the Triton interpreter
(TRITON_INTERPRET=1, set here before triton is imported); on a CUDA machine with
TRITIUM_KERNEL_DEVICE=cuda (scripts/gpu_check.sh) the same tests run natively on the GPU.

Every output buffer the kernels allocate is NaN-poisoned first, inputs are fresh random each run
(the seed is printed on failure), sizes are odd on purpose."""
import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib
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


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("D,R", [(16, 8), (24, 4)])  # full, partial rotary with odd head dim
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float16)])
def test_rope_write_kv(neox, D, R, dtype, cache_dtype):
    """RoPE of q and k fused with the KV write: q and the cache rows are the bits of `rope` then
    `write_kv` (the two kernels it replaces), and the float64 rotation within rounding."""
    T, H, KVH, NB, BS = 5, 20, 3, 6, 4  # 20 q heads: two head blocks
    qkv = torch.randn(T, (H + 2 * KVH) * D).to(dtype)  # q, k, v: strided slices of one projection
    q, k, v = (t.reshape(T, -1, D) for t in qkv.split([H * D, KVH * D, KVH * D], dim=1))
    pos = torch.randint(0, 4000, (T,))
    inv_freq = 1.0 / (10000 ** (torch.arange(R, dtype=torch.float32) * 2 / D))
    slots = torch.tensor([23, 0, -1, 9, 14])
    kc = dev(torch.full((NB, BS, KVH, D), float("nan"), dtype=cache_dtype))
    vc = kc.clone()
    kc2, vc2 = kc.clone(), vc.clone()
    got = OPS.rope_write_kv(dev(q), dev(k), dev(v), dev(pos), dev(inv_freq), neox, 0.0, 1.0, kc, vc, dev(slots))
    want_q = OPS.rope(dev(q), dev(pos), dev(inv_freq), neox)
    OPS.write_kv(OPS.rope(dev(k), dev(pos), dev(inv_freq), neox), dev(v), kc2, vc2, dev(slots))
    assert got.shape == (T, H, D) and got.dtype == dtype and torch.equal(got.cpu(), want_q.cpu())
    assert torch.equal(kc.cpu().nan_to_num(7.0), kc2.cpu().nan_to_num(7.0))
    assert torch.equal(vc.cpu().nan_to_num(7.0), vc2.cpu().nan_to_num(7.0))
    tol = 2e-5 if dtype == torch.float32 and DEV == "cpu" else (1e-4 if dtype == torch.float32 else 2e-2)
    assert rel_err(got, rope_oracle(q, pos, inv_freq, neox)) < tol
    kr = rope_oracle(k, pos, inv_freq, neox)
    kc = kc.cpu()
    for i, sl in enumerate(slots.tolist()):
        if sl >= 0:
            assert rel_err(kc[sl // BS, sl % BS], kr[i]) < tol
            assert torch.equal(vc.cpu()[sl // BS, sl % BS], v[i].to(cache_dtype))
    assert (~torch.isnan(kc.reshape(NB * BS, -1)).all(-1)).sum().item() == 4  # the slot -1 row is skipped


@pytest.mark.parametrize("M", [1, 8, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_silu_write_the_q8_form(M, dtype):
    """Decode rows (M <= 8): RMSNorm and SiLU-mul also write their output's q8_1 form, the bits the
    activation quantizer computes from the stored output, and the GEMV that reads the output uses
    it (same product as from a copy quantized by its own launch); a view of the output does not
    carry it; 9 rows: no form."""
    from kernels.triton.qmatmul_q8 import attached, quantize_act

    C, F = 160, 1056  # 5 groups; 33 groups over two 1024-column blocks (the second one partial)
    x, r, w = torch.randn(M, C).to(dtype), torch.randn(M, C).to(dtype), torch.randn(C)
    gu = torch.randn(M, 2 * F).to(dtype)
    normed, _ = OPS.add_rms_norm(dev(x), dev(r), dev(w), 1e-5)
    outs = [OPS.rms_norm(dev(x), dev(w), 1e-6), normed, OPS.silu_mul(dev(gu[:, :F]), dev(gu[:, F:]))]
    for y in outs:
        form = attached(y)
        if M > 8:
            assert form is None
            continue
        assert form is not None and attached(y.view(M, -1, 32)) is None and attached(y.clone()) is None
        for a, b in zip(form, quantize_act(y)):
            assert torch.equal(a.cpu(), b.cpu())
        wq = OPS.prepare_weight(qw_dev(random_qweight(Q.Q4_K if y.shape[1] % 256 == 0 else Q.Q8_0, 7, y.shape[1])))
        assert torch.equal(OPS.qmatmul(y, wq).cpu(), OPS.qmatmul(y.clone(), wq).cpu())
    assert rel_err(outs[0], rms_norm_oracle(x, w, 1e-6)) < TOL[dtype]
    assert rel_err(outs[2], gu[:, :F].double() * torch.sigmoid(gu[:, :F].double()) * gu[:, F:].double()) < TOL[dtype]


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
    """The splits' partials merged by the last split of each (sequence, KV head) in the kernel."""
    from kernels.triton.paged_decode import paged_decode, split_counters

    case = make_paged_case([1, 1, 1], [200, 5, 64], 8, 2, 16, 8, dtype=torch.float32)
    out = dev(torch.full_like(case.q, float("nan")))
    for _ in range(2):  # the second launch finds the split counters zeroed again by the first
        got = paged_decode(dev(case.q), dev(case.k_cache), dev(case.v_cache), dev(case.block_tables),
                           dev(case.cu_seqlens_q), dev(case.kv_lens), 0.3, out=out, num_splits=num_splits)
        assert rel_err(got, attention_oracle(case, 0.3)) < F32_TOL * 10
        assert not split_counters(out.device, 1).any()
        out.fill_(float("nan"))


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_attention_writes_the_q8_form_of_its_output(num_splits, monkeypatch):
    """Decode rows: the attention output, seen as [T, H * D] (what o_proj reads), carries its q8_1
    form, the bits the activation quantizer computes from it, written by the decode kernel (one
    split) or by the merging split."""
    pd = importlib.import_module("kernels.triton.paged_decode")  # (the package exports the function)
    from kernels.triton.qmatmul_q8 import attached, quantize_act

    case = make_paged_case([1, 1, 1], [90, 5, 40], 8, 2, 32, 4, dtype=torch.float16)
    monkeypatch.setattr(pd, "num_splits_for", lambda *a, **k: num_splits)
    got = OPS.paged_attention(dev(case.q), dev(case.k_cache), dev(case.v_cache), dev(case.block_tables),
                              dev(case.cu_seqlens_q), dev(case.kv_lens), 0.2, max_q_len=1)
    assert rel_err(got, attention_oracle(case, 0.2)) < 3e-3
    flat = got.reshape(3, 8 * 32)
    form = attached(flat)
    assert form is not None and attached(got) is None  # [T, H, D] is not a matmul's [M, K]
    for a, b in zip(form, quantize_act(flat)):
        assert torch.equal(a.cpu(), b.cpu())


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

    def fastest(cands, run, device):
        timed.append([c.kwargs["n"] for c in cands])
        return min(cands, key=lambda c: speed[c.kwargs["n"]])

    monkeypatch.setattr(tuning, "_fastest", fastest)
    cfgs = [triton.Config({"n": n}) for n in "abc"]
    gpu = types.SimpleNamespace(type="cuda")
    ran = []

    def run(c):
        ran.append(c.kwargs["n"])
        return torch.ones(3)  # every candidate agrees

    t = tuning.Tuner("test", cfgs)
    assert t.launch((64, 4096), {}, gpu, run).kwargs["n"] == "a"
    assert (t.misses, timed) == (1, [])
    with tuning.tuning():
        assert t.launch((64, 4096), {}, gpu, run).kwargs["n"] == "b"
        assert t.launch((64, 4096), {}, gpu, run).kwargs["n"] == "b"
    assert timed == [["a", "b", "c"]] and ran == ["a", "a", "b", "c", "b", "b"]  # checked, then chosen
    assert list((tmp_path / "triton-tune").glob("test-Fake_GPU_80GB-*.json"))
    fresh = tuning.Tuner("test", cfgs)
    assert fresh.launch((64, 4096), {}, gpu, run).kwargs["n"] == "b"
    assert (fresh.misses, fresh.timed, len(timed)) == (0, 0, 1)
    other = tuning.Tuner("test", cfgs[::-1])  # another config list: another table
    assert other.launch((64, 4096), {}, gpu, run).kwargs["n"] == "c"
    # pruned to one candidate, or off CUDA outside the warm-up: nothing to choose
    one = tuning.Tuner("test1", cfgs, prune=lambda cs, meta: cs[2:])
    with tuning.tuning():
        assert one.launch((1,), {}, gpu, run).kwargs["n"] == "c"
    assert t.launch((9,), {}, torch.device("cpu"), run).kwargs["n"] == "a"
    assert len(timed) == 1


def test_tuning_rejects_a_wrong_candidate(tmp_path, monkeypatch):
    """Start-up tuning of the real dp4a GEMV (the interpreter on the CPU; the host clock times):
    one candidate is made to write a wrong output, as a miscompiled config would; it is rejected
    before any timing, never chosen, and the launch's result is right. A candidate that raises is
    rejected too."""
    import warnings

    import triton

    from kernels.triton import tuning

    qmatmul_q8 = importlib.import_module("kernels.triton.qmatmul_q8")  # the module (the package exports the function)
    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path))
    cfgs = [triton.Config({"BLOCK_N": 16, "G": 4}, num_warps=2), triton.Config({"BLOCK_N": 8, "G": 2}, num_warps=1),
            triton.Config({"BLOCK_N": 4, "G": 4}, num_warps=1), triton.Config({"BLOCK_N": 2, "G": 1}, num_warps=1)]
    broken, raising = cfgs[1], cfgs[3]
    tuner = tuning.Tuner("q8_test", cfgs, tol=qmatmul_q8.Q8GEMV.tol)
    monkeypatch.setattr(qmatmul_q8, "Q8GEMV", tuner)
    real_launch = tuner.launch
    timed = []

    def launch(key, meta, device, run):
        def run_maybe_broken(c):
            if c is raising:
                raise RuntimeError("ptxas failed")  # as a config that does not compile
            y = run(c)
            if c is broken:
                y[:, ::3] += 1.0  # a wrong output, finite
            return y
        return real_launch(key, meta, device, run_maybe_broken)

    monkeypatch.setattr(tuner, "launch", launch)
    real_fastest = tuning._fastest

    def fastest(cands, run, device):
        timed.append(list(cands))
        return real_fastest(cands, run, device)

    monkeypatch.setattr(tuning, "_fastest", fastest)
    w = OPS.prepare_weight(qw_dev(random_qweight(Q.Q4_0, 16, 64)))
    x = dev(torch.randn(1, 64))
    with warnings.catch_warnings(record=True) as caught, tuning.tuning():
        warnings.simplefilter("always")
        y = OPS.qmatmul(x, w)
    assert tuner.rejected == 2 and len(timed) == 1
    assert broken not in timed[0] and raising not in timed[0] and len(timed[0]) == 2
    assert sum("rejected" in str(c.message) for c in caught) == 2
    key = next(iter(tuner.table))
    assert tuner.configs[tuner.table[key]] not in (broken, raising)
    assert rel_err(y, _q8_act(x.cpu()) @ OPS.dequantize(w).double().cpu().T) < 1e-5


def _q8_act(x: torch.Tensor) -> torch.Tensor:
    """x rounded to its q8_1 codes (per 32: scale amax / 127, round to nearest), float64."""
    M, K = x.shape
    g = x.double().reshape(M, K // 32, 32)
    amax = g.abs().amax(-1, keepdim=True)
    q = torch.where(amax > 0, torch.round(g.float() * (127.0 / amax.float())).double(), torch.zeros_like(g))
    return (q * (amax.float() / 127.0).double()).reshape(M, K)


PACKED = [Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize("qtype", PACKED, ids=lambda q: q.name)
def test_repacked_weights_dequantize_exactly(qtype):
    """The GPU layout (kernels/triton/packed.py) holds the same values as the GGUF blocks."""
    w = random_qweight(qtype, 13, 512)
    p = OPS.prepare_weight(qw_dev(w))
    assert p.layout == "gpu" and p.gpu.lo.dtype == torch.int32 and p.gpu.lo.is_contiguous()
    want = dequant_oracle(w)
    assert rel_err(OPS.dequantize(p, torch.float32), want) == 0.0
    ids = torch.tensor([12, 0, 5, 5, 1])
    assert rel_err(OPS.embedding(dev(ids), p), want[ids]) == 0.0
    assert p.nbytes <= w.nbytes * 1.03  # the codes and factors, no float copy


@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("qtype", PACKED, ids=lambda q: q.name)
def test_q8_gemv(qtype, M):
    """Decode rows: exactly the product with the activations rounded to their q8_1 codes, and
    within 2% of the float product."""
    K = 512
    w = random_qweight(qtype, 37, K)
    p = OPS.prepare_weight(qw_dev(w))
    xbig = torch.randn(M, K + 8)
    x = xbig[:, 3:3 + K]
    y = OPS.qmatmul(dev(x), p)
    assert y.shape == (M, 37) and y.dtype == torch.float32
    assert rel_err(y, _q8_act(x.contiguous()) @ dequant_oracle(w).T) < (1e-5 if DEV == "cpu" else 1e-4)
    assert rel_err(y, x.double() @ dequant_oracle(w).T) < 2e-2


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("M,xdtype", [(9, torch.float32), (37, torch.float32), (20, torch.bfloat16)])
def test_packed_tiled(qtype, M, xdtype):
    """Prompt rows on the repacked weights: the tensor-core kernel, float (not quantized) activations."""
    w = random_qweight(qtype, 23, 256 if qtype != Q.Q8_0 else 96)
    p = OPS.prepare_weight(qw_dev(w))
    x = torch.randn(M, w.cols).to(xdtype)
    y = OPS.qmatmul(dev(x), p)
    assert y.dtype == xdtype
    assert rel_err(y, x.double() @ dequant_oracle(w).T) < (F32_TOL if xdtype == torch.float32 else 2 * TOL[xdtype])


@pytest.mark.parametrize("M", [2, 12])
def test_prepared_group_of_mixed_types(M):
    """q / k / v of two types (Q4_K_M's Q6_K attn_v): one weight, one input quantization, the
    parts' outputs side by side, as the separate products."""
    ws = [random_qweight(Q.Q4_K, 24, 256), random_qweight(Q.Q4_K, 8, 256), random_qweight(Q.Q6_K, 8, 256)]
    (g,) = OPS.prepare_weights([qw_dev(w) for w in ws])
    assert g.layout == "gpu" and g.rows == 40 and [p.rows for p in g.parts] == [32, 8]
    assert [p.qtype for p in g.parts] == [Q.Q4_K, Q.Q6_K]
    x = torch.randn(M, 256)
    y = OPS.qmatmul(dev(x), g)
    parts = [OPS.qmatmul(dev(x), OPS.prepare_weight(qw_dev(w))) for w in ws]
    assert torch.equal(y.cpu(), torch.cat([t.cpu() for t in parts], 1))
    assert rel_err(OPS.dequantize(g), torch.cat([dequant_oracle(w) for w in ws])) == 0.0


@pytest.mark.parametrize("M", [2, 20])  # decode (q8 GEMV / dequantizing GEMV), prompt rows (tiled)
@pytest.mark.parametrize("qtypes", [(Q.Q4_1, Q.Q4_1, Q.Q5_1), (Q.Q2_K, Q.Q3_K, Q.Q5_K), (Q.Q4_K, Q.Q4_K, Q.Q3_K)],
                         ids=lambda t: "-".join(q.name for q in t))
def test_prepared_group_with_types_without_a_repack(qtypes, M):
    """Q4_1 (the default model's), Q5_1, Q2_K, Q3_K have no GPU repack: `prepare_weights` keeps them
    in GGUF blocks for the dequantizing kernels, repacks the others of the group, and the group's
    outputs side by side are the product with every matrix."""
    packed = importlib.import_module("kernels.triton.packed")
    K = 256
    ws = [random_qweight(qt, n, K) for qt, n in zip(qtypes, (24, 8, 8))]
    out = OPS.prepare_weights([qw_dev(w) for w in ws])
    assert sum(o.rows for o in out) == 40
    for o in out:
        assert (o.layout == "gpu") == (o.qtype in packed.PACKED_TYPES), (o.qtype, o.layout)
    x = torch.randn(M, K)
    y = torch.cat([OPS.qmatmul(dev(x), o).cpu() for o in out], 1)
    want_w = torch.cat([dequant_oracle(w) for w in ws])
    q8 = M <= 8 and any(o.layout == "gpu" for o in out)  # a repacked part's decode rows: q8_1 activations
    assert rel_err(y, x.double() @ want_w.T) < (2e-2 if q8 else F32_TOL)
    assert rel_err(torch.cat([OPS.dequantize(o).cpu() for o in out]), want_w) == 0.0


def test_every_tuned_config_computes_the_product():
    """Each candidate of every matmul tuner, launched on its own (under the interpreter every
    config runs here; on a GPU at start-up they are only compared with the first)."""
    qmatmul_gemv, qmatmul_q8, qmatmul_tiled = (importlib.import_module(f"kernels.triton.{m}")
                                               for m in ("qmatmul_gemv", "qmatmul_q8", "qmatmul_tiled"))
    cases = [(qmatmul_q8.Q8GEMV, Q.Q4_K, 3, 512, True), (qmatmul_tiled.PACKED_TILED, Q.Q6_K, 40, 256, True),
             (qmatmul_gemv.GEMV, Q.Q4_K, 5, 512, False), (qmatmul_tiled.TILED, Q.Q8_0, 33, 128, False)]
    for tuner, qt, M, K, prepared in cases:
        w = random_qweight(qt, 19, K)
        wd = OPS.prepare_weight(qw_dev(w)) if prepared else qw_dev(w)
        x = torch.randn(M, K)
        want = (_q8_act(x) if tuner is qmatmul_q8.Q8GEMV else x.double()) @ dequant_oracle(w).T
        saved = tuner.configs
        try:
            for c in saved:
                tuner.configs = [c]
                y = OPS.qmatmul(dev(x), wd)
                assert rel_err(y, want) < (1e-5 if DEV == "cpu" else 3e-3), (tuner.name, c)
        finally:
            tuner.configs = saved

"""Each instruction-set build of the float CPU kernels (kernels/cpu/gemv.c, attention.c; AVX-512,
AVX2 + FMA, portable C), forced with TRITIUM_CPU_ISA: the GEMV bit-exact against an independent
emulation of its arithmetic (an in-order float32 fma chain per output), the decode attention
against float64 and bit-identical across builds. A build this CPU cannot run is still compiled,
and forcing it is a clear error instead of an illegal instruction."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import gemv as cpu_gemv
from kernels.cpu import native
from tests.kernel_oracles import attention_oracle, make_paged_case

# TRITIUM_CPU_ISA value (a level of kernels/cpu/isa.py's ladder) -> the float kernels' build it selects
FORCE = {"avx512": "avx512", "avx2": "avx2", "scalar": "scalar"}
needs_cc = pytest.mark.skipif(native.env.c_compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(params=sorted(FORCE))
def isa(request, monkeypatch):
    """Every build: the ones this CPU runs are forced and yielded; the others must compile and be
    refused at selection."""
    monkeypatch.setenv("TRITIUM_CPU_ISA", request.param)
    want = FORCE[request.param]
    if want not in native.supported_isas():
        assert native.build(native.kernels_library(want)) is not None  # compiles anywhere (x86 gcc)
        with pytest.raises(ValueError, match="cannot run"):
            native.lib()
        pytest.skip(f"this CPU does not run the {want} build (compiled, and refused when forced)")
    assert native.float_isa() == want and cpu_gemv.isa() == want
    return want


def test_unknown_isa_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITIUM_CPU_ISA", "avx9000")
    with pytest.raises(ValueError, match="TRITIUM_CPU_ISA='avx9000'"):
        native.lib()
    from kernels.cpu import qdot_lib
    with pytest.raises(ValueError, match="TRITIUM_CPU_ISA='avx9000'"):
        qdot_lib.current_isa()


def test_one_ladder_for_every_library(monkeypatch):
    """kernels/cpu/isa.py decides the level once; the float kernels and qdot both take their build of
    it: the default (the best level this CPU runs, never vnni-emu) and every forced one; a level this
    CPU cannot run is refused by both."""
    from kernels.cpu import isa as ladder
    from kernels.cpu import qdot_lib

    monkeypatch.delenv("TRITIUM_CPU_ISA", raising=False)
    best = next(lv for lv in ladder.LADDER if lv.default and ladder.runs(lv.cpu_flags))
    assert ladder.level() == best
    assert (native.float_isa(), qdot_lib.current_isa()) == (best.float, best.qdot)
    assert native.float_isa() == native.supported_isas()[0]
    assert qdot_lib.current_isa() == next(b for b in qdot_lib.supported_isas() if b != "vnni-emu")
    for lv in ladder.LADDER:
        monkeypatch.setenv("TRITIUM_CPU_ISA", lv.name)
        if ladder.runs(lv.cpu_flags):
            assert (native.float_isa(), qdot_lib.current_isa()) == (lv.float, lv.qdot)
            assert lv.float in native.supported_isas() and lv.qdot in qdot_lib.supported_isas()
        else:
            for pick in (native.float_isa, qdot_lib.current_isa):
                with pytest.raises(ValueError, match="cannot run"):
                    pick()


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once (round to nearest even), exactly, from float64 arithmetic:
    a * b is exact in float64; s = a * b + c rounded to float64 has the exact error e (TwoSum);
    rounding s to float32 is correct unless s lies exactly halfway between two float32 values
    and e != 0, where the true value is on e's side of the midpoint."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bv = s - p
    e = (p - (s - bv)) + (c64 - bv)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    other = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf))).astype(np.float32)
    mid = (r64 != s) & ((r64 + other.astype(np.float64)) * 0.5 == s) & (e != 0)
    toward_other = np.sign(e) == np.sign(other.astype(np.float64) - s)
    return np.where(mid & toward_other, other, r).astype(np.float32)


def fma_chain_gemv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[m, n] = fma chain over k of x[m, k] * w[n, k], in float32 (the kernel's arithmetic)."""
    M, K = x.shape
    acc = np.zeros((M, w.shape[0]), dtype=np.float32)
    for k in range(K):
        acc = fma32(x[:, k:k + 1], w[None, :, k], acc)
    return acc


def test_fma32_emulation_is_exact_on_halfway_cases():
    """The reference itself: a product plus an addend landing exactly halfway in float64 but not
    in exact arithmetic (double rounding would go the wrong way)."""
    a = np.float32(1 + 2.0 ** -12)
    b = np.float32(1 + 2.0 ** -12)  # a * b = 1 + 2^-11 + 2^-24 exactly
    c = np.float32(-(2.0 ** -60))
    # exact: 1 + 2^-11 + 2^-24 - 2^-60: just below the midpoint 1 + 2^-11 + 2^-24 -> rounds down
    got = fma32(np.array([a]), np.array([b]), np.array([c]))[0]
    assert got == np.float32(1 + 2.0 ** -11)
    got = fma32(np.array([a]), np.array([b]), np.array([-c]))[0]  # just above: rounds up
    assert got == np.nextafter(np.float32(1 + 2.0 ** -11), np.float32(2))
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(4096).astype(np.float32) for _ in range(3))
    want = np.array([float(np.float32(float(x) * float(y) + float(z))) for x, y, z in zip(a, b, c)])
    assert (np.abs(fma32(a, b, c) - want) <= np.abs(want) * 2.0 ** -23).all()  # near everywhere


@needs_cc
@pytest.mark.parametrize("M,N,K", [(1, 200, 96), (3, 77, 130), (8, 130, 33), (9, 64, 7), (20, 65, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bgemv_is_the_fma_chain_on_every_build(isa, M, N, K, dtype):
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g).to(dtype)
    y = cpu_gemv.bgemv(x, cpu_gemv.pack(w), N, n_threads=2)
    want = fma_chain_gemv(x.numpy(), w.float().numpy())
    assert y.shape == (M, N) and np.array_equal(y.numpy(), want)


def _decode(case, softcap):
    from kernels.cpu import attention as cpu_attention
    return cpu_attention.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables,
                                      case.kv_lens.tolist(), 0.15, softcap, n_threads=2, flash=False)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim,heads", [(32, (8, 2)), (64, (14, 2)), (40, (6, 6)), (8, (4, 1)), (24, (24, 2))])
def test_paged_decode_on_every_build(isa, dtype, head_dim, heads, monkeypatch):
    """Within float32 rounding of float64 on every build, and the same bits as the others."""
    H, KVH = heads
    case = make_paged_case([1, 1, 1], [1, 300, 2100], H, KVH, head_dim, 16, dtype=dtype)
    for softcap in (0.0, 7.0):
        out = _decode(case, softcap)
        expect = attention_oracle(case, 0.15, softcap)
        assert float((out.double() - expect).norm() / expect.norm()) < 1e-5
        for other in native.supported_isas():
            if other != isa:
                monkeypatch.setenv("TRITIUM_CPU_ISA", {v: k for k, v in FORCE.items()}[other])
                assert torch.equal(_decode(case, softcap), out), other
                monkeypatch.setenv("TRITIUM_CPU_ISA", {v: k for k, v in FORCE.items()}[isa])


@needs_cc
def test_thread_pool_calls_from_several_threads_and_thread_counts():
    """kernels/cpu/pool.c: every chunk runs exactly once whatever the thread count, and calls made
    at the same time from several Python threads (one runs on the pool, the others inline) all
    give the single-threaded bits."""
    from concurrent.futures import ThreadPoolExecutor
    g = torch.Generator().manual_seed(3)
    w = cpu_gemv.pack(torch.randn(4000, 64, generator=g))
    xs = [torch.randn(m, 64, generator=g) for m in (1, 2, 5, 8)]
    want = [cpu_gemv.bgemv(x, w, 4000, n_threads=1) for x in xs]
    for nt in (2, 3, 8):
        for x, y in zip(xs, want):
            assert torch.equal(cpu_gemv.bgemv(x, w, 4000, n_threads=nt), y)
    with ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(cpu_gemv.bgemv, xs[i % 4], w, 4000, 2) for i in range(64)]
        for i, f in enumerate(futs):
            assert torch.equal(f.result(), want[i % 4])


@needs_cc
@pytest.mark.parametrize("M,N,K", [(1, 200, 96), (2, 77, 130), (4, 300, 64), (7, 65, 33)])
def test_head_scan_i8_is_exact_integer_arithmetic(isa, M, N, K):
    """The output head's first pass: int32 dot products of the int8 rows, then two float32
    products, bit for bit; and within `topk.first_pass`'s bound of the float64 logits."""
    import importlib
    cpu_topk = importlib.import_module("kernels.cpu.topk")  # the package exports the function `topk`
    g = torch.Generator().manual_seed(11 * M + K)
    x = torch.randn(M, K, generator=g) * 3
    w = torch.randn(N, K, generator=g) * torch.rand(N, 1, generator=g)
    q, scale, err, norm = cpu_gemv.pack_i8(cpu_gemv.pack(w))
    q4 = cpu_gemv.interleave_i8(q)
    K4 = q4.shape[1] * 4
    qx, sx = cpu_gemv.quantize_rows(x, K4)
    y = cpu_gemv.head_scan_i8(qx, sx, q4, scale, N, n_threads=2)
    assert not qx[:, K:].any()  # zero padding
    dots = qx[:, :K].numpy().astype(np.int64) @ cpu_gemv.unpack(q, N).numpy().astype(np.int64).T
    want = (dots.astype(np.float32) * sx.numpy()[:, None]) * scale[:N].numpy()[None, :]
    assert np.array_equal(y.numpy(), want)
    head = cpu_topk.TopkHead(q4, scale, float(norm.max()), float(err.max()))
    a, b = cpu_topk.first_pass(x, head, N)
    exact = (x.double() @ w.double().T).numpy()
    assert (np.abs(a - exact) <= b[:, None]).all()
    assert (b < 0.03 * x.double().norm(dim=1).numpy() * float(norm.max())).all()  # a few % of |x| max |w_r|

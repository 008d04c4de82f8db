"""The CPU backend (`kernels.cpu`): its C kernels against float64, the weight layouts
`prepare_weight` chooses, the top-k helpers, and building the C kernels (cache key, failures)."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import kernels
from kernels import cpu, ref
from kernels.cpu import gemv as cpu_gemv
from kernels.cpu import matmul, native
from kernels.qweight import QWeight
from tests.kernel_oracles import attention_oracle, make_paged_case, random_qweight


@pytest.mark.skipif(not cpu_gemv.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("M,N,K", [(1, 1000, 256), (3, 777, 130), (8, 4097, 64), (16, 50, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bgemv_matches_float64(M, N, K, dtype):
    x = torch.randn(M, K)
    w = torch.randn(N, K).to(dtype)
    tiles = cpu_gemv.pack(w)
    assert torch.equal(cpu_gemv.unpack(tiles, N), w)
    assert tiles.dtype == dtype
    y = cpu_gemv.bgemv(x, tiles, N)
    ref64 = x.double() @ w.double().T
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert float((y.double() - ref64).norm() / ref64.norm()) < 1e-6


@pytest.mark.parametrize("N,K", [(1000, 256), (777, 130), (50, 7)])
def test_pack_i8_reports_its_error(N, K):
    """The int8 copy of the top-k output head: row r is scale_r * q_r, and pack_i8 reports
    |w_r - scale_r q_r| and |w_r| exactly (the bound of kernels/cpu/topk.py's first pass rests on
    them; the pass itself: tests/test_cpu_isa.py)."""
    w = torch.randn(N, K) * torch.rand(N, 1) * 3  # rows of different scales
    w[3] = 0.0  # an all-zero row keeps a finite scale
    tiles = cpu_gemv.pack(w)
    q, scale, err, norm = cpu_gemv.pack_i8(tiles)
    assert q.dtype == torch.int8 and q.shape == tiles.shape and scale.shape == err.shape == (tiles.shape[0] * 64,)
    deq = cpu_gemv.unpack(q.double() * scale.double().view(-1, 1, 64), N)
    assert torch.allclose((w.double() - deq).norm(dim=1), err[:N], rtol=1e-6, atol=1e-9)
    assert torch.allclose(w.double().norm(dim=1), norm[:N], rtol=1e-12) and bool((norm[N:] == 0).all())
    assert float(err[3]) == 0.0 and bool((deq[3] == 0).all())
    assert bool((err[:N] <= 0.02 * norm[:N] + 1e-12).all())  # and it is a close copy (~0.8% for these rows)


QUANT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_qgemv_tiles_hold_the_exact_gguf_values(qtype):
    """kernels.cpu.qgemv repacks every quantized type into integer tiles without changing a value
    (unpack, row gathers and row ranges equal the GGUF dequantizer bit for bit); its GEMV matches a
    float64 product for decode-sized and prefill-sized batches, through the backend's qmatmul too."""
    from gguf import GGMLQuantizationType
    from kernels import dequant_ref
    from kernels.cpu import qgemv as cpu_qgemv
    if not cpu_qgemv.available():
        pytest.skip("no vectorized C kernels on this machine")
    qt = GGMLQuantizationType[qtype]
    N, K = 131, 512  # rows not a multiple of the 64-row tile
    w = random_qweight(qt, N, K)
    want = dequant_ref.dequantize(w)
    p = cpu_qgemv.pack(w)  # the fallback for types the integer-dot kernels lack (kernels.cpu.qdot)
    assert p.layout in cpu_qgemv.LAYOUTS and (p.rows, p.cols) == (N, K)
    assert torch.equal(cpu_qgemv.unpack(p), want)
    assert torch.equal(cpu.dequantize(p), want)
    assert torch.equal(cpu_qgemv.unpack(p, 60, 130), want[60:130])
    ids = torch.tensor([130, 0, 64, 31, 32, 63, 99])
    assert torch.equal(cpu.embedding(ids, p), want[ids])
    for M in (1, 2, 5, 17, 40):
        x = torch.randn(M, K)
        expect = x.double() @ want.double().T
        got = cpu.qmatmul(x, p)
        assert got.shape == (M, N) and got.dtype == torch.float32
        assert float((got.double() - expect).norm() / expect.norm()) < 1e-6
    assert p.nbytes < 1.3 * K * 64 * 3  # at most ~1.25 bytes per weight (3 tiles of 64 rows)


def test_kth_largest_matches_a_sort():
    import numpy as np
    from kernels.cpu.topk import kth_largest
    rng = np.random.default_rng()
    for n in (1, 5, 300, 20000):
        r = rng.standard_normal(n).astype(np.float32)
        r[rng.integers(0, n, 2)] = -np.inf
        r[rng.integers(0, n, 2)] = r.max()  # ties at the top
        desc = np.sort(r)[::-1]
        for k in {k for k in (1, 2, 40, n) if k <= n}:
            assert kth_largest(r, k) == desc[k - 1], (n, k)


def test_cpu_topk_matches_torch_topk():
    from kernels.cpu.topk import topk
    for n, k in ((10, 3), (151936, 40), (151936, 1), (5000, 5000)):
        row = torch.randn(n)
        row[torch.randint(0, n, (n // 2,))] = float("-inf")  # a sparse row, as the top-k head returns
        v, i = topk(row, k)
        tv, ti = torch.topk(row, k)
        assert torch.equal(v, tv) and torch.equal(row[i], v) and len(set(i.tolist())) == k
    row = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    v, i = topk(row, 2)
    assert i.tolist() == [1, 2] and v.tolist() == [3.0, 3.0]  # ties: lower index first


@pytest.mark.parametrize("rows,cols", [(300, 64), (4096, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_prepared_weights_give_the_same_products(rows, cols, dtype):
    """Float weights on the CPU: big ones in 64-row tiles (float16/bfloat16 kept in their type
    where the C kernels widen them with vector instructions), small ones transposed for BLAS."""
    data = torch.randn(rows, cols).to(dtype)
    w = QWeight.from_float(data)
    p = cpu.prepare_weight(w)
    big = rows * cols >= matmul._BGEMV_MIN_ELEMS and cpu_gemv.vectorized()
    assert p.layout == ("tiles64" if big else "cols") and (p.rows, p.cols) == (rows, cols)
    kept = big and dtype != torch.float32
    assert p.data.dtype == (dtype if kept else torch.float32)
    assert torch.equal(cpu.dequantize(p), data.float())
    ids = torch.tensor([0, rows - 1, 5])
    assert torch.equal(cpu.embedding(ids, p), data.float()[ids])
    for M in (1, 5, 9, 17, 40):
        x = torch.randn(M, cols)
        expect = x.double() @ data.double().T
        got = cpu.qmatmul(x, p)
        assert float((got.double() - expect).norm() / expect.norm()) < 1e-5


@pytest.mark.skipif(not cpu_gemv.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("softcap", [0.0, 7.0])
@pytest.mark.parametrize("head_dim", [40, 32, 128])  # 40: a 16-column vector part + a scalar tail
def test_cpu_paged_decode_matches_float64(dtype, softcap, head_dim):
    from kernels.cpu import attention as cpu_attention

    # GQA 8/2, a single-token sequence, one spanning many out-of-order blocks
    case = make_paged_case([1, 1, 1, 1], [1, 17, 300, 64], 8, 2, head_dim, 16, dtype=dtype)
    assert cpu_attention.supported(case.q, case.k_cache)
    out = cpu_attention.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables,
                                     case.kv_lens.tolist(), 0.15, softcap, flash=False)
    expect = attention_oracle(case, 0.15, softcap)
    assert float((out.double() - expect).norm() / expect.norm()) < 1e-5
    # and through the dispatch: the CPU backend routes decode-only batches to it
    full = cpu.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q,
                               case.kv_lens, 0.15, softcap)
    assert float((full.double() - expect).norm() / expect.norm()) < 2e-3


@pytest.mark.skipif(not cpu_gemv.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (0, 7.0), (5, 0.0), (64, 0.0)])
def test_cpu_prompt_rows_are_decodes_of_their_positions(window, softcap, fast, monkeypatch):
    """Prefill and mixed batches under 64 rows: each query row gets exactly the bits of the decode
    kernel run for its position alone (its key count, its sequence's table), so a token's attention
    does not depend on how its prompt was batched; and the numbers are the float64 oracle's (within
    float16 rounding where the rows take llama.cpp's flash attention: fattn.c, float16 accumulator;
    float32's in the kernels' own numerics, a backend built with Numerics.OWN: attention.c)."""
    from kernels.cpu import attention as cpu_attention

    numerics = kernels.Numerics.OWN if fast else kernels.Numerics.GGML
    b = kernels.Backend.for_device("cpu", "cpu", numerics)
    # a prompt after a cached prefix, a decode row, a whole prompt, a one-row prompt chunk
    case = make_paged_case([7, 1, 40, 1], [30, 17, 40, 64], 8, 2, 40, 16, dtype=torch.float16)
    monkeypatch.setattr(cpu_attention, "_ROWS_SCRATCH_ELEMS", 8 * 60)  # several chunks of rows
    case.q = case.q.float()  # float32 activations, as the CPU model runs (float16 cache)
    out = b.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q,
                            case.kv_lens, 0.15, softcap, window=window)
    expect = attention_oracle(case, 0.15, softcap, window)
    assert float((out.double() - expect).norm() / expect.norm()) < (1e-5 if fast else 2e-3)
    cu, lens = case.cu_seqlens_q.tolist(), case.kv_lens.tolist()
    for s in range(len(lens)):
        q_len = cu[s + 1] - cu[s]
        for j in range(q_len):
            row = cu[s] + j
            alone = cpu_attention.paged_decode(case.q[row:row + 1], case.k_cache, case.v_cache,
                                               case.block_tables[s:s + 1], [lens[s] - q_len + j + 1], 0.15,
                                               softcap, window=window, numerics=numerics)
            assert torch.equal(out[row:row + 1], alone), (s, j)


@pytest.mark.parametrize("window", [1, 7, 64])
def test_cpu_paged_decode_sliding_window(window, monkeypatch):
    """The C kernel and the batched torch decode read only the last `window` keys."""
    from kernels.cpu import attention as cpu_attention

    case = make_paged_case([1, 1, 1, 1], [1, 17, 300, 64], 8, 2, 32, 16, dtype=torch.float16)
    expect = attention_oracle(case, 0.15, 0.0, window)
    out = cpu_attention.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables,
                                     case.kv_lens.tolist(), 0.15, 0.0, window=window, flash=False)
    assert float((out.double() - expect).norm() / expect.norm()) < 1e-5
    flash = cpu_attention.paged_decode(case.q, case.k_cache, case.v_cache, case.block_tables,
                                       case.kv_lens.tolist(), 0.15, 0.0, window=window, flash=True)
    assert float((flash.double() - expect).norm() / expect.norm()) < 2e-3
    monkeypatch.setattr(cpu_attention, "supported", lambda q, k: False)
    out = cpu.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q,
                              case.kv_lens, 0.15, window=window)
    assert float((out.double() - expect).norm() / expect.norm()) < 2e-3


def test_torch_decode_path_without_the_c_kernel(monkeypatch):
    """Machines without a compiler run decode attention through torch (one padded batch, or per
    sequence past the padding bound): same results."""
    from kernels.cpu import attention as cpu_attention

    monkeypatch.setattr(cpu_attention, "supported", lambda q, k: False)
    for bound in (cpu_attention._BATCHED_DECODE_MAX_ELEMS, 0):
        monkeypatch.setattr(cpu_attention, "_BATCHED_DECODE_MAX_ELEMS", bound)
        for lens in ([1, 17, 300, 64], [45]):
            case = make_paged_case([1] * len(lens), lens, 8, 2, 32, 16, dtype=torch.float16)
            out = cpu.paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                      case.cu_seqlens_q, case.kv_lens, 0.15)
            expect = attention_oracle(case, 0.15)
            assert float((out.double() - expect).norm() / expect.norm()) < 2e-3


def test_without_the_c_kernels_the_torch_paths_give_the_same_numbers(monkeypatch):
    """`native.lib()` None (no compiler, a failed build, TRITIUM_NO_CPU_KERNELS): BLAS layouts,
    GGUF blocks, no top-k head, torch attention."""
    from gguf import GGMLQuantizationType
    from kernels.cpu import qdot
    monkeypatch.setattr(native, "lib", lambda: None)
    monkeypatch.setattr(qdot, "available", lambda: False)
    assert not cpu.packs_quantized() and not cpu_gemv.available()
    w = QWeight.from_float(torch.randn(300, 256))
    p = cpu.prepare_weight(w)
    assert p.layout == "cols" and cpu.prepare_topk_head(p) is None
    x = torch.randn(3, 256)
    assert float((cpu.qmatmul(x, p).double() - x.double() @ w.data.double().T).norm()) < 1e-3
    qw = random_qweight(GGMLQuantizationType.Q4_K, 64, 256)
    assert cpu.prepare_weight(qw).layout == "rows"
    assert cpu.prepare_weight(qw, unpack_quantized=True).layout == "cols"


@pytest.mark.skipif(not cpu_gemv.i8_fast(), reason="no C compiler or no AVX2/AVX-512 on this machine")
@pytest.mark.parametrize("k", [1, 40])
def test_topk_logits_keep_the_exact_top_k(k):
    """The int8 first pass plus the exact recompute of its candidates: each row's top-k (banned
    excluded) is the exact row's, rows with topk 0 are exact everywhere, few entries are computed."""
    V, C = 5000, 64
    w = cpu.prepare_weight(QWeight.from_float(torch.randn(V, C) * 0.3))
    head = cpu.prepare_topk_head(w)
    assert head is not None and kernels.Backend("cpu").prepare_topk_head is cpu.prepare_topk_head
    x = torch.randn(3, C)
    exact = ref.qmatmul(x, QWeight.from_float(cpu.dequantize(w)))
    banned = [(7, int(exact[0].argmax())), (), ()]
    got = cpu.topk_logits(x, w, head, [k, 0, k], banned)
    assert torch.allclose(got[1], exact[1], rtol=1e-5, atol=1e-5)
    for i in (0, 2):
        want = exact[i].clone()
        want[list(banned[i])] = float("-inf")
        tv, ti = torch.topk(want, k)
        pv, pi = torch.topk(got[i], k)
        assert set(ti.tolist()) == set(pi.tolist()) and torch.allclose(pv, tv, rtol=1e-5, atol=1e-5)
        assert int((got[i] > float("-inf")).sum()) < V // 4


def _c_file(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return name


def test_build_failure_is_logged_once_with_the_compiler_error(tmp_path, monkeypatch, caplog):
    if native.env.c_compiler() is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path / "cache"))
    src = _c_file(tmp_path, "broken.c", "int f(void) { return undeclared_name; }\n")
    lib = native.Library("broken", (src,), directory=tmp_path)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.load(lib) is None
        assert native.load(lib) is None  # not built nor logged again
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "undeclared_name" in warnings[0].getMessage()
    assert not list((tmp_path / "cache").glob("*.so"))


def test_build_cache_key_and_defines(tmp_path, monkeypatch):
    """A build is reused for the same sources, compiler, flags and defines (never keyed on the host
    name), rebuilt when any of them changes; defines reach the compiler."""
    if native.env.c_compiler() is None:
        pytest.skip("no C compiler on this machine")
    import ctypes
    import platform
    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path / "cache"))
    src = _c_file(tmp_path, "answer.c", "int answer(void) { return ANSWER; }\n")
    sig = {"answer": ([], ctypes.c_int)}
    forty_two = native.Library("answer", (src,), sig, defines=(("ANSWER", "42"),), directory=tmp_path)
    seven = native.Library("answer", (src,), sig, defines=(("ANSWER", "7"),), directory=tmp_path)
    assert native.load(forty_two).answer() == 42 and native.load(seven).answer() == 7
    cc = native.env.c_compiler()
    key = native.build_key(forty_two, cc)
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    assert native.build_key(forty_two, cc) == key
    assert native.build_key(seven, cc) != key
    portable = native.Library("answer", (src,), sig, defines=(("ANSWER", "42"),), directory=tmp_path,
                              opt_flags=("-O2",))  # another target: its own build
    assert native.build_key(portable, cc) != key and "-march=native" not in portable.compile_flags()
    assert native.build(portable).exists()
    (tmp_path / src).write_text("int answer(void) { return ANSWER + 1; }\n")
    assert native.build_key(forty_two, cc) != key
    assert len(list((tmp_path / "cache").glob("answer-*.so"))) == 3


def test_backend_ops_are_functions_even_after_a_submodule_import(monkeypatch):
    """`import kernels.cpu.topk` rebinds the package's `topk` to the submodule; a CPU backend built
    after that still gets the function (it was the module: every top-k sampling call failed with
    "'module' object is not callable" in a process that had imported it)."""
    import importlib
    import sys

    import kernels
    import kernels.cpu

    monkeypatch.setattr(kernels.Backend, "_instances", {})
    monkeypatch.delitem(kernels.cpu.__dict__, "topk", raising=False)
    monkeypatch.delitem(sys.modules, "kernels.cpu.topk", raising=False)  # a first import binds the name
    importlib.import_module("kernels.cpu.topk")
    assert isinstance(kernels.cpu.__dict__["topk"], type(kernels))  # the submodule, as Python binds it
    b = kernels.Backend.for_device("cpu")
    v, i = b.topk(torch.tensor([1.0, 3.0, 2.0]), 2)
    assert v.tolist() == [3.0, 2.0] and i.tolist() == [1, 2]


def test_kernels_and_runtime_import_without_triton():
    """The CPU path never imports triton: importing the runtime and running CPU ops."""
    code = ("import sys, torch, kernels, runtime.model.decoder, runtime.sampling.sampler, runtime.model.kv_store\n"
            "import runtime.serving.blocks\n"
            "x = torch.randn(2, 8)\n"
            "kernels.rms_norm(x, torch.ones(8), 1e-6)\n"
            "kernels.qmatmul(x, kernels.QWeight.from_float(torch.randn(3, 8)))\n"
            "kernels.topk(torch.randn(10000), 5)\n"
            "assert 'triton' not in sys.modules, 'triton was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not cpu_gemv.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("D,R", [(32, 16), (64, 16), (128, 64)])  # R < D/2: dimensions passed through
def test_pointwise_ops_match_the_reference(neox, D, R):
    """kernels/cpu/pointwise.c: RMSNorm (+ residual add) and RoPE within float32 rounding of the
    reference, on non-contiguous views too; other dtypes go to the reference itself."""
    from kernels.cpu import pointwise
    from tests.kernel_oracles import rms_norm_oracle, rope_oracle
    g = torch.Generator().manual_seed(D + R)
    T, C = 5, 3 * D
    big = torch.randn(T, 2 * C, generator=g)
    x, res = big[:, :C], torch.randn(T, C, generator=g)  # x: a strided view
    w = torch.randn(C, generator=g)
    assert float((cpu.rms_norm(x, w, 1e-6).double() - rms_norm_oracle(x, w, 1e-6)).abs().max()) < 1e-5
    normed, s = cpu.add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(s, x + res)
    assert float((normed.double() - rms_norm_oracle(x + res, w, 1e-5)).abs().max()) < 1e-5
    q = torch.randn(T, 3, D, generator=g)
    pos = torch.tensor([0, 7, 300, -5, 4095])
    inv = 1.0 / (10000.0 ** (torch.arange(R, dtype=torch.float32) / R))
    got = cpu.rope(q, pos, inv, neox)
    want = rope_oracle(q, pos, inv, neox)
    assert got.shape == q.shape and float((got.double() - want).abs().max()) < 2e-4  # |angle| up to 4095 rad
    assert torch.equal(got[..., 2 * R:], q[..., 2 * R:])
    assert cpu.rope is pointwise.rope and torch.equal(cpu.rope(q.half(), pos, inv, neox), ref.rope(q.half(), pos, inv, neox))


@pytest.mark.skipif(not cpu_gemv.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_write_kv_is_the_reference_bit_for_bit(dtype):
    """pointwise.c's write_kv_f32: the same cache bytes as kernels.ref.write_kv (round to nearest even
    into float16), negative slots skipped, strided inputs, an out-of-range slot refused."""
    from kernels.cpu import pointwise
    g = torch.Generator().manual_seed(7)
    NB, BS, KVH, D, T = 6, 4, 2, 24, 9
    k = torch.randn(T, 2 * KVH, D, generator=g)[:, ::2] * 70000 ** torch.rand(T, 1, 1, generator=g)  # strided, f16 overflow
    v = torch.randn(T, KVH, D, generator=g) * 1e-6  # float16 subnormals
    slots = torch.tensor([3, -1, 0, 23, 8, -1, 17, 5, 11])
    start = [torch.randn(NB, BS, KVH, D, generator=g).to(dtype) for _ in range(2)]
    caches = [[c.clone() for c in start] for _ in range(2)]
    ref.write_kv(k, v, caches[0][0], caches[0][1], slots)
    assert cpu.write_kv is pointwise.write_kv
    cpu.write_kv(k, v, caches[1][0], caches[1][1], slots)
    for a, b in zip(caches[0], caches[1]):
        assert torch.equal(a.view(torch.int16 if dtype == torch.float16 else torch.int32),
                           b.view(torch.int16 if dtype == torch.float16 else torch.int32))
    with pytest.raises(IndexError):
        cpu.write_kv(k, v, caches[1][0], caches[1][1], torch.full((T,), NB * BS))


def test_pointwise_ops_split_rows_over_threads_without_changing_bits():
    """add_rms_norm, rope, silu_mul and gelu_mul run prompts' rows on several threads (pointwise.c
    run_rows, from 16 rows): the same bits as on one thread, rows being independent."""
    from kernels.cpu import native, pointwise
    if native.lib() is None:
        pytest.skip("no compiled CPU kernels")
    g = torch.Generator().manual_seed(3)
    T, C, H, D = 37, 96, 3, 32
    x, r, w = torch.randn(T, C, generator=g), torch.randn(T, C, generator=g), torch.randn(C, generator=g)
    q, pos = torch.randn(T, H, D, generator=g), torch.arange(100, 100 + T)
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    gu = torch.randn(T, 2 * C, generator=g) * 3
    gate, up = gu.split(C, dim=1)

    def run():
        return (*pointwise.add_rms_norm(x, r, w, 1e-6), pointwise.rms_norm(x, w, 1e-6),
                pointwise.rope(q, pos, inv, True), pointwise.silu_mul(gate, up), pointwise.gelu_mul(gate, up))

    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        two = run()
    finally:
        torch.set_num_threads(n)
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    from kernels import ref
    want = (*ref.add_rms_norm(x, r, w, 1e-6), ref.rms_norm(x, w, 1e-6), ref.rope(q, pos, inv, True),
            ref.silu_mul(gate, up), ref.gelu_mul(gate, up))
    for a, b in zip(two, want):  # and every row computed (the split covers them all)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

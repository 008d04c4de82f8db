"""kernels/cpu/qdot: integer-dot quantized matmul, every GGUF quantized type, every ISA build.

References, both independent of the C code:
- integer reference: the activations quantized in numpy float32 exactly as the kernel does, the
  GGUF blocks decoded to integer codes and integer sub-block scales (torch, from the block layouts),
  the integer dots computed exactly and the float scales applied in float64. The kernel may differ
  only by its float32 scale products and accumulation: |y - ref| <= 4 (nb + 2) 2^-24 sum_b |term_b|.
- float reference: float64 x @ dequant_ref(W)^T; the difference is the activation quantization
  (8 bits per block): relative Frobenius error < 2e-2 (measured ~0.5-0.8%).
Each test forces an ISA through TRITIUM_CPU_ISA (skipped where the CPU lacks it; "vnni-emu" runs the
VNNI code paths on AVX2 with an exact emulation of vpdpbusd).
"""
from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from kernels import dequant_ref
from kernels.cpu import qdot
from kernels.dequant_ref import _bits, _f16, _nibbles, _scale_min_k4, _shifts
from tests.kernel_oracles import random_qweight

ISAS = ["avx512vnni", "avxvnni", "vnni-emu", "avx2", "scalar"]
TYPES32 = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
TYPESK = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ALL = TYPES32 + TYPESK


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    if request.param not in qdot.supported_isas():
        pytest.skip(f"this CPU cannot run {request.param}")
    monkeypatch.setenv("TRITIUM_CPU_ISA", request.param)
    if qdot.lib() is None:
        pytest.skip("no C compiler")
    # the variant really is the one asked for: 0 portable, 1 AVX2, 2 256-bit VNNI (native or
    # emulated), 3 AVX-512 VNNI (the `isa` its router qd_route is asked with)
    assert qdot.lib().qd_isa_level() == {"scalar": 0, "avx2": 1, "avx512vnni": 3}.get(request.param, 2)
    return request.param


# ------------------------------------------------------------------------------------ references

def quantize_ref(x: np.ndarray, kind: str):
    """numpy float32 replay of qdot_quant.c: (q int64 [M, K], d float64 [M, nb], sums int64)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    M, K = x.shape
    if kind == "q8_0":
        xb = x.reshape(M, K // 32, 32)
        amax = np.abs(xb).max(axis=2)
        with np.errstate(divide="ignore"):
            idv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        d = (amax / np.float32(127.0)).astype(np.float32).astype(np.float16).astype(np.float32)  # stored as fp16
        q = np.rint((xb * idv[:, :, None]).astype(np.float32)).astype(np.int64)
        return q.reshape(M, K), d.astype(np.float64), q.sum(axis=2)
    xb = x.reshape(M, K // 256, 256)
    idx = np.abs(xb).argmax(axis=2)  # first of the largest |x|, as the strict > scan
    mx = np.take_along_axis(xb, idx[:, :, None], axis=2)[:, :, 0]
    zero = mx == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(zero, np.float32(0.0), np.float32(-127.0) / np.where(zero, np.float32(1), mx)).astype(np.float32)
        q = np.minimum(127, np.rint((xb * iscale[:, :, None]).astype(np.float32))).astype(np.int64)
        d = np.where(zero, np.float32(0.0), np.float32(1.0) / np.where(zero, np.float32(1), iscale)).astype(np.float32)
    q[zero] = 0
    return q.reshape(M, K), d.astype(np.float64), q.reshape(M, K // 16, 16).sum(axis=2)


def int_decode(w):
    """GGUF blocks -> (codes int64 [N, nb, bs] signed values, d [N, nb] f64, sub-scales int64
    [N, nb, nsub] (32-blocks: 1), dmin [N, nb] f64 or None, mins int64 [N, nb, nsub] or None).
    W = d * sc_j * code - dmin * m_j for K-quants; d * code + dmin (Q4_1/Q5_1 m) for 32-blocks."""
    bs, ts = GGML_QUANT_SIZES[w.qtype]
    N, nb = w.rows, w.cols // bs
    b = w.data.reshape(N * nb, ts)
    n = b.shape[0]
    t = w.qtype
    dmin = mins = None
    if t == Q.Q8_0:
        q, d, sc = b[:, 2:].view(torch.int8).long(), _f16(b[:, :2]), torch.ones(n, 1, dtype=torch.long)
    elif t in (Q.Q4_0, Q.Q4_1):
        o = 2 if t == Q.Q4_0 else 4
        q, d, sc = _nibbles(b[:, o:], 16).long() - (8 if t == Q.Q4_0 else 0), _f16(b[:, :2]), torch.ones(n, 1, dtype=torch.long)
        if t == Q.Q4_1:
            dmin = _f16(b[:, 2:4])
    elif t in (Q.Q5_0, Q.Q5_1):
        o = 2 if t == Q.Q5_0 else 4
        q = (_nibbles(b[:, o + 4:], 16) | (_bits(b[:, o:o + 4]) << 4)).long() - (16 if t == Q.Q5_0 else 0)
        d, sc = _f16(b[:, :2]), torch.ones(n, 1, dtype=torch.long)
        if t == Q.Q5_1:
            dmin = _f16(b[:, 2:4])
    elif t == Q.Q2_K:
        s = b[:, :16]
        q = ((b[:, 16:80].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3).reshape(n, 256).long()
        d, dmin, sc, mins = _f16(b[:, 80:82]), _f16(b[:, 82:84]), (s & 15).long(), (s >> 4).long()
    elif t == Q.Q3_K:
        hm, qs, s = b[:, :32], b[:, 32:96], b[:, 96:108]
        lo = ((s[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), b.device)) & 15).reshape(n, 16)
        hi = ((s[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), b.device)) & 3).reshape(n, 16)
        sc = (lo | (hi << 4)).long() - 32
        ql = ((qs.reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3).reshape(n, 256)
        qh = ((hm.reshape(n, 1, 1, 32) >> _shifts(list(range(8)), (1, 1, 8, 1), b.device)) & 1).reshape(n, 256)
        q, d = ql.long() - 4 * (1 - qh.long()), _f16(b[:, 108:110])
    elif t in (Q.Q4_K, Q.Q5_K):
        d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
        s, m = _scale_min_k4(b[:, 4:16])
        sc, mins = s.long(), m.long()
        if t == Q.Q4_K:
            q = _nibbles(b[:, 16:], 32).long()
        else:
            ql = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
            hb = (b[:, 16:48].reshape(n, 1, 32) >> _shifts(list(range(8)), (1, 8, 1), b.device)) & 1
            q = (ql | (hb << 4)).reshape(n, 256).long()
    elif t == Q.Q6_K:
        lo = _nibbles(b[:, :128], 64).reshape(n, 8, 32)
        hi = ((b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b.device)) & 3).reshape(n, 8, 32)
        q = (lo | (hi << 4)).reshape(n, 256).long() - 32
        d, sc = _f16(b[:, 208:210]), b[:, 192:208].contiguous().view(torch.int8).long()
    else:
        raise AssertionError(t)
    r = lambda v: None if v is None else v.reshape(N, nb, -1)  # noqa: E731
    return (q.reshape(N, nb, bs), d.double().reshape(N, nb), r(sc),
            None if dmin is None else dmin.double().reshape(N, nb), r(mins))


def int_reference(w, x: torch.Tensor):
    """(y float64 [M, N], bound float64 [M, N]) of the same integer arithmetic as the kernel."""
    kind = qdot.act_kind(int(w.qtype))
    xq, xd, _ = quantize_ref(x.numpy(), kind)
    q, d, sc, dmin, mins = int_decode(w)
    N, nb, bs = q.shape
    M = x.shape[0]
    nsub = sc.shape[2]
    sub = bs // nsub
    xq_t = torch.from_numpy(xq).double().reshape(M, nb, nsub, sub)
    isub = torch.einsum("nbjk,mbjk->mnbj", q.double().reshape(N, nb, nsub, sub), xq_t)  # exact integers
    isum = (isub * sc.double()[None]).sum(-1)  # [M, N, nb]
    xd_t = torch.from_numpy(xd)[:, None, :]  # [M, 1, nb]
    terms = [d[None] * xd_t * isum]
    if dmin is not None:
        xsub = xq_t.sum(-1)  # [M, nb, nsub]
        msum = (xsub[:, None] * (mins.double()[None] if mins is not None else 1.0)).sum(-1)  # [M, N, nb]
        terms.append((-1.0 if mins is not None else 1.0) * dmin[None] * xd_t * msum)
    y = sum(t.sum(-1) for t in terms)
    bound = 4 * (nb + 2) * 2.0 ** -24 * sum(t.abs().sum(-1) for t in terms) + 1e-30
    return y, bound


def random_x(M, K, gen):
    x = torch.randn(M, K, generator=gen)
    x[:, :: max(1, K // 7)] *= 8  # outliers: blocks with a dominant value
    if M > 2:
        x[1, :] = 0.0  # an all-zero row (zero activation scales)
        x[2, :32] = 0.0  # a zero first block
    return x


def check(w, x, isa):
    h = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
    assert h.nbytes == qdot.repacked_bytes(int(w.qtype), w.rows, w.cols)
    ref, bound = int_reference(w, x)
    for nt in (2, 1, 3):  # outputs NaN-poisoned: a row no thread writes shows
        # qdot's own float order (exact=0): the bound below is of its per-block sums; llama.cpp's order
        # (the default for Q5_0 / Q8_0 / Q4_K / Q6_K) is checked against llama.cpp itself in
        # tests/test_exact_numerics.py
        y = qdot.matmul(x, h, n_threads=nt, out=torch.full((x.shape[0], w.rows), float("nan")), exact=0)
        assert y.shape == (x.shape[0], w.rows) and y.dtype == torch.float32
        assert bool(torch.isfinite(y).all()), f"{isa} n_threads={nt}: unwritten outputs"
        worst = float(((y.double() - ref).abs() / bound).max())
        assert worst <= 1.0, f"{isa} {w.qtype.name} {tuple(x.shape)}x{w.rows}: error {worst:.3g} x the float32 bound"
    return y, ref


# ------------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("name", sorted(qdot.ISA_FLAGS))
def test_every_isa_variant_compiles(name):
    """Every variant builds, also those this CPU cannot run (their code is then only compiled here;
    the VNNI code paths run through "vnni-emu"). The build goes to the usual cache, whose file name
    is a hash of every source, header, flag and the compiler's target: a cached file is this very
    build, and the variants the other tests run are compiled once per session, not twice."""
    if not qdot.supported_isas() or qdot.build("scalar") is None:
        pytest.skip("no C compiler")
    if name != "scalar" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86 variants")
    path = qdot.build(name)
    assert path is not None and path.stat().st_size > 0


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,nblk", [(1, 1), (13, 1), (8, 3), (37, 2), (200, 4)])
def test_matmul_matches_integer_reference(isa, qtype, rows, nblk):
    gen = torch.Generator().manual_seed(1000 * int(qtype) + rows + nblk)
    bs = GGML_QUANT_SIZES[qtype][0]
    w = random_qweight(qtype, rows, bs * nblk, gen)
    for M in range(1, 10):
        check(w, random_x(M, w.cols, gen), isa)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("M", [37, 430])
def test_prefill_sizes_match_integer_reference(isa, qtype, M):
    gen = torch.Generator().manual_seed(77 * int(qtype) + M)
    bs = GGML_QUANT_SIZES[qtype][0]
    w = random_qweight(qtype, 75, bs * (3 if bs == 256 else 9), gen)
    check(w, random_x(M, w.cols, gen), isa)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_prefill_same_bits_on_every_vector_build(qtype, monkeypatch):
    """The vector builds agree bit for bit at decode and prefill sizes: AVX-512 VNNI runs prefill's
    pairs of panels in 512-bit vectors (an odd panel, and decode, in 256-bit ones), AVX2 sums in
    int16 first; every output lane does the same integer sums and the same float operations in
    the same order."""
    vector = [i for i in qdot.supported_isas() if i != "scalar"]
    if len(vector) < 2 or qdot.build("avx2") is None:
        pytest.skip("fewer than two vector builds on this CPU (or no C compiler)")
    gen = torch.Generator().manual_seed(300 + int(qtype))
    bs = GGML_QUANT_SIZES[qtype][0]
    w = random_qweight(qtype, 75, bs * (3 if bs == 256 else 9), gen)  # 10 panels: pairs, items, a rest
    for M in (1, 3, 8, 130):  # decode sizes (codes decoded in registers) and prefill (scratch)
        x = random_x(M, w.cols, gen)
        got = {}
        for name in vector:
            monkeypatch.setenv("TRITIUM_CPU_ISA", name)
            h = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
            got[name] = qdot.matmul(x, h, n_threads=2)
        first = vector[0]
        for name in vector[1:]:
            assert torch.equal(got[name], got[first]), (M, first, name)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_matmul_close_to_float_reference(qtype):
    gen = torch.Generator().manual_seed(5 + int(qtype))
    bs = GGML_QUANT_SIZES[qtype][0]
    w = random_qweight(qtype, 96, bs * (4 if bs == 256 else 28), gen)
    x = torch.randn(6, w.cols, generator=gen)
    y = qdot.matmul(x, qdot.prepare(w.data, int(w.qtype), w.rows, w.cols))
    ref = x.double() @ dequant_ref.dequantize(w).double().T
    rel = float((y.double() - ref).norm() / ref.norm())
    assert rel < 2e-2, rel


def test_quantization_replays_exactly(isa):
    gen = torch.Generator().manual_seed(3)
    x = random_x(5, 512, gen)
    x[3, 300] = -x[3, 256:512].abs().max() * 2  # negative maximum of a 256-block
    x[4, 10] = 1e-30  # denormal-ish scale
    for kind in ("q8_0", "q8_K"):
        a = qdot.quantize_activations(x, kind)
        q, d, s = quantize_ref(x.numpy(), kind)
        assert np.array_equal(a.q.numpy().astype(np.int64), q), kind
        assert np.array_equal(a.d.numpy().astype(np.float64), d), kind
        assert np.array_equal(a.sums.numpy().astype(np.int64), s), kind
        assert int(a.q.abs().max()) <= 127
        if kind == "q8_0":  # llama.cpp's q8_1 s: fp16 of the unrounded d times the sum (Q4_1 / Q5_1)
            xb = x.numpy().reshape(5, 16, 32)
            dd = (np.abs(xb).max(axis=2) / np.float32(127.0)).astype(np.float32)
            s1 = (dd * s.astype(np.float32)).astype(np.float32).astype(np.float16).astype(np.float32)
            assert np.array_equal(a.s1.numpy(), s1)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_repack_keeps_every_value(isa, qtype):
    """dequantize_rows of the repacked weight == dequant_ref of the GGUF blocks, bit for bit."""
    gen = torch.Generator().manual_seed(11 + int(qtype))
    bs = GGML_QUANT_SIZES[qtype][0]
    w = random_qweight(qtype, 21, bs * 2, gen)
    h = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
    ref = dequant_ref.dequantize(w)
    assert torch.equal(qdot.dequantize_rows(h), ref)
    ids = torch.tensor([20, 0, 7, 8, 20])
    assert torch.equal(qdot.dequantize_rows(h, ids), ref[ids])


def test_repack_is_the_gguf_size():
    for qtype in ALL:
        bs, ts = GGML_QUANT_SIZES[qtype]
        for rows, cols in ((896, 896 if bs == 32 else 4864), (151936, 896 if bs == 32 else 1024)):
            gguf = rows * cols // bs * ts
            got = qdot.repacked_bytes(int(qtype), rows, cols)
            assert gguf <= got < gguf + 128 * ((rows + 7) // 8), (qtype.name, gguf, got)


def test_out_view_and_shared_activations(isa):
    """One quantization for two weights (q/k/v style), results written into column slices."""
    gen = torch.Generator().manual_seed(9)
    wa, wb = random_qweight(Q.Q5_0, 24, 128, gen), random_qweight(Q.Q8_0, 16, 128, gen)
    ha, hb = (qdot.prepare(w.data, int(w.qtype), w.rows, w.cols) for w in (wa, wb))
    x = torch.randn(3, 128, generator=gen)
    acts = qdot.quantize_activations(x, "q8_0")
    out = torch.full((3, 40), float("nan"))
    qdot.matmul(acts, ha, out=out[:, :24])
    qdot.matmul(acts, hb, out=out[:, 24:])
    assert torch.equal(out[:, :24], qdot.matmul(x, ha)) and torch.equal(out[:, 24:], qdot.matmul(x, hb))
    with pytest.raises(ValueError):
        qdot.matmul(qdot.quantize_activations(torch.randn(3, 256), "q8_K"), ha)


def test_threads_do_not_change_results(isa):
    gen = torch.Generator().manual_seed(4)
    w = random_qweight(Q.Q4_K, 300, 512, gen)
    h = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
    x = torch.randn(11, 512, generator=gen)
    assert torch.equal(qdot.matmul(x, h, n_threads=1), qdot.matmul(x, h, n_threads=2))


@pytest.mark.parametrize("M", [1, 3, 4, 5, 9, 37])
def test_group_quantizes_once_for_several_weights(isa, M):
    """q/k/v-style groups: mixed 32-block types, and a group mixing both activation kinds."""
    gen = torch.Generator().manual_seed(100 + M)
    for specs in ([(Q.Q5_0, 40), (Q.Q5_0, 16), (Q.Q8_0, 16)], [(Q.Q8_0, 21), (Q.Q4_K, 13), (Q.Q6_K, 8), (Q.Q4_0, 3)]):
        ws = [random_qweight(t, n, 512, gen) for t, n in specs]
        hs = [qdot.prepare(w.data, int(w.qtype), w.rows, w.cols) for w in ws]
        g = qdot.group(hs)
        x = random_x(M, 512, gen)
        y = qdot.matmul_group(x, g)
        assert y.shape == (M, sum(n for _, n in specs))
        for part, w, h in zip(torch.split(y, g.splits, dim=1), ws, hs):
            ref, bound = int_reference(w, x)
            assert float(((part.double() - ref).abs() / bound).max()) <= 1.0
            assert torch.equal(part, qdot.matmul(x, h))  # same arithmetic as the single-weight call
        # strided input rows (a view) and a caller-provided output
        big = torch.zeros(M, 600)
        big[:, 40:552] = x
        out = torch.empty(M, g.rows)
        assert torch.equal(qdot.matmul_group(big[:, 40:552], g, out=out), y)


def test_release_source_keeps_the_mapping_readable(tmp_path):
    """prepare(release_source=True) on a file mapping: same weight, and the mapped bytes read back
    unchanged afterwards (the dropped pages fault back in from the page cache)."""
    if qdot.lib() is None:
        pytest.skip("no C compiler")
    gen = torch.Generator().manual_seed(21)
    w = random_qweight(Q.Q5_0, 512, 896, gen)  # ~300 KB: many whole pages
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * 100 + w.data.numpy().tobytes())
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    view = mm[100:].reshape(w.rows, -1)
    h1 = qdot.prepare(view, int(w.qtype), w.rows, w.cols, release_source=True)
    h2 = qdot.prepare(w.data, int(w.qtype), w.rows, w.cols)
    assert torch.equal(h1.data, h2.data)
    assert np.array_equal(np.asarray(view), w.data.numpy())


# ------------------------------------------------------------------ the CPU backend's dispatch

@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_cpu_backend_prepares_every_type_for_qdot(isa, qtype):
    """kernels.Backend("cpu").prepare_weight gives every qdot type the "x8" panels (the GGUF size,
    the exact values back through dequantize and embedding), and qmatmul runs the integer-dot
    kernel of the forced ISA: on gaussian activations within 2% of the float64 product of the dequantized weight (the
    activation quantization), and equal to qdot.matmul itself."""
    import kernels
    cpu = kernels.Backend("cpu")
    gen = torch.Generator().manual_seed(77 + int(qtype))
    bs = GGML_QUANT_SIZES[qtype][0]
    w = random_qweight(qtype, 45, 2 * bs if bs == 256 else 8 * bs, gen)
    want = dequant_ref.dequantize(w)
    p = cpu.prepare_weight(w)
    assert p.layout == "x8" and (p.rows, p.cols) == (w.rows, w.cols)
    # rows padded to 48, < 64 bytes of padding per panel of 8 rows
    assert p.nbytes == qdot.repacked_bytes(int(qtype), w.rows, w.cols) < w.nbytes // w.rows * 48 + 64 * 6
    assert torch.equal(cpu.dequantize(p), want)
    ids = torch.tensor([44, 0, 8, 7, 8])
    assert torch.equal(cpu.embedding(ids, p), want[ids])
    for M in (1, 4, 37):
        x = torch.randn(M, w.cols, generator=gen)
        y = cpu.qmatmul(x, p)
        ref = x.double() @ want.double().T
        assert float((y.double() - ref).norm() / ref.norm()) < 2e-2
        assert torch.equal(y, qdot.matmul(x, p.kernel.weights[0]))


def test_cpu_backend_groups_weights_that_read_one_input(isa):
    """prepare_weights: q/k/v of mixed qdot types -> one "x8" group whose output is the three
    products side by side (one call); a group with a type qdot lacks (here F16) falls back to
    concatenated rows when all types match (here they do not), prepared one by one."""
    import kernels
    from kernels.qweight import QWeight
    cpu = kernels.Backend("cpu")
    gen = torch.Generator().manual_seed(5)
    ws = [random_qweight(Q.Q5_0, 64, 256, gen), random_qweight(Q.Q5_0, 16, 256, gen), random_qweight(Q.Q8_0, 16, 256, gen)]
    (g,) = cpu.prepare_weights(ws)
    assert g.layout == "x8" and g.rows == 96 and g.kernel.splits == [64, 16, 16]
    x = torch.randn(3, 256, generator=gen)
    y = cpu.qmatmul(x, g)
    for (a, b), w in zip([(0, 64), (64, 80), (80, 96)], ws):
        assert torch.equal(y[:, a:b], cpu.qmatmul(x, cpu.prepare_weight(w)))
    mixed = [ws[0], ws[1], QWeight.from_float(torch.randn(16, 256, generator=gen))]
    parts = cpu.prepare_weights(mixed)
    assert [p.rows for p in parts] == [64, 16, 16] and parts[2].is_float and parts[0].layout == "x8"
    full = torch.cat([dequant_ref.dequantize(w) for w in mixed])
    got = torch.cat([cpu.qmatmul(x, p) for p in parts], dim=1)
    ref = x.double() @ full.double().T
    assert float((got.double() - ref).norm() / ref.norm()) < 2e-2
    # the reference backend: rows concatenated when the types match, nothing repacked
    assert [(p.layout, p.rows) for p in kernels.Backend("torch").prepare_weights(ws[:2])] == [("rows", 80)]
    assert [p.rows for p in kernels.Backend("torch").prepare_weights(ws)] == [64, 16, 16]

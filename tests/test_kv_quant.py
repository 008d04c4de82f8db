"""The quantized KV cache on the CPU (kernels/cpu/kv_quant.c): writes and attention against the numpy
reference (kernels/kv_quant_ref.py), against float attention, and bit for bit against llama.cpp's own
ggml_flash_attn_ext and from_float (recorded by scripts/record_kv_quant_ggml.py for the AVX2 order)."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from kernels import kv_quant_ref as R
from kernels import ref as torch_ref
from kernels.cpu import kv_quant as C
from kernels.cpu import native
from tests.kv_quant_cases import CASES, F16, F32, inputs
from tests.llama_tokens import float_order, reference_file

needs_c = pytest.mark.skipif(native.lib() is None, reason="the C kernels are not built (no compiler)")
# the dequantized values' largest error relative to the block's largest |x|: half a step (of 2 |x|max for Q4_1, Q5_1), or (Q4_0, Q5_0,
# IQ4_NL) the code range's short side (-8..7: 1/8 of the block's largest |x| at worst)
REL_ERR = {Q.Q8_0: 0.005, Q.Q4_0: 0.126, Q.Q4_1: 0.068, Q.Q5_0: 0.063, Q.Q5_1: 0.033, Q.IQ4_NL: 0.15}


def _rows(seed: int, n: int, D: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, D, generator=g) * 3
    x[1, 0, :32] = 0  # an all-zero block
    x[2, 1, 7] = -x[2, 1, :32].abs().max()  # two values of the block's largest |x|, the first negative
    x[3, 0, 32:64] = 1.25  # a constant block (Q4_1 / Q5_1: d = 0)
    return x


@needs_c
@pytest.mark.parametrize("t", R.KV_QUANT_TYPES, ids=lambda t: t.name)
def test_writes_equal_the_reference_and_round_trip(t):
    x = _rows(int(t), 40, 96)
    qc, qr = C.quantize_rows(x, t), R.quantize_rows(x, t)
    assert qc.shape == (40, 2, R.row_bytes(t, 96)) and torch.equal(qc, qr)
    back = C.dequantize_rows(qc, t)
    assert torch.equal(back, R.dequantize_rows(qr, t))
    amax = x.reshape(40, 2, 3, 32).abs().amax(-1, keepdim=True)
    err = ((back - x).reshape(40, 2, 3, 32).abs() / amax.clamp_min(1e-30)).max().item()
    assert err <= REL_ERR[t], err


def _paged(rows: np.ndarray, BS: int, seed: int):
    """cache rows [n, KVH, W] -> (a paged cache [NB, BS, KVH, W], its block table [1, n_blocks]) with the
    sequence's blocks in a shuffled order."""
    n, KVH, W = rows.shape
    nb = (n + BS - 1) // BS
    NB = nb + 3
    order = torch.randperm(NB, generator=torch.Generator().manual_seed(seed))[:nb]
    cache = torch.zeros((NB, BS, KVH, W), dtype=torch.from_numpy(rows[:1].copy()).dtype)
    for t in range(n):
        cache[order[t // BS], t % BS] = torch.from_numpy(rows[t].copy())
    return cache, order.to(torch.int32)[None, :]


def _as_cache(raw: np.ndarray, t: int, D: int) -> np.ndarray:
    """recorded bytes [n, KVH, row] -> the cache rows as tritium stores them (float types as floats)"""
    if t == F16:
        return raw.view(np.float16)
    if t == F32:
        return raw.view(np.float32)
    return raw


def _typ(t: int):
    return None if t in (F16, F32) else Q(t)


def _attend(case, q, kc, vc, bt, n_rows: int):
    """the case's last n_rows query rows as one batch of prompt rows (the sequence's n_kv keys)"""
    qt = torch.from_numpy(q[case.n_q - n_rows:])
    cu = torch.tensor([0, n_rows], dtype=torch.int32)
    lens = torch.tensor([case.n_kv], dtype=torch.int32)
    return C.paged_attention(qt, kc, vc, bt, cu, lens, case.scale, case.softcap, window=case.window,
                             k_type=_typ(case.k_type), v_type=_typ(case.v_type))


@needs_c
@pytest.mark.skipif(float_order() != "avx2", reason="recorded in llama.cpp's AVX2 order only")
def test_bits_equal_llama_cpp():
    path = reference_file("kv_quant_ggml.json")
    if not path.exists():
        pytest.skip(f"no recording for this float order ({path})")
    rec = json.loads(path.read_text())["cases"]
    for case in CASES:
        r = rec[case.name]
        q, k, v = inputs(case)
        raw = {n: np.frombuffer(base64.b64decode(r[n]), dtype=np.uint8).reshape(case.n_kv, case.KVH, -1)
               for n in ("k_rows", "v_rows")}
        for x, t, n in ((k, case.k_type, "k_rows"), (v, case.v_type, "v_rows")):  # llama.cpp's writes
            if _typ(t) is not None:
                assert np.array_equal(C.quantize_rows(torch.from_numpy(x), Q(t)).numpy(), raw[n]), (case.name, n)
        kc, bt = _paged(_as_cache(raw["k_rows"], case.k_type, case.D), 16, case.seed)
        vc, _ = _paged(_as_cache(raw["v_rows"], case.v_type, case.D), 16, case.seed)
        want = np.frombuffer(base64.b64decode(r["out"]), dtype=np.float32).reshape(case.n_q, case.H, case.D)
        got = _attend(case, q, kc, vc, bt, case.n_q).numpy()
        assert np.array_equal(got, want), (case.name, float(np.abs(got - want).max()))
        last = _attend(case, q, kc, vc, bt, 1).numpy()  # the last row alone (a decode step): the same bits
        assert np.array_equal(last[0], want[-1]), case.name


@needs_c
@pytest.mark.parametrize("kt,vt", [(Q.Q8_0, Q.Q8_0), (Q.Q4_0, Q.Q4_1), (Q.Q5_0, Q.Q5_1), (Q.IQ4_NL, None)],
                         ids=lambda t: getattr(t, "name", "f16"))
def test_attention_near_float_attention(kt, vt):
    """Several sequences, decode and prompt rows, a sliding window: the C kernel against float32
    attention over the same (dequantized) caches; the only difference is the query's 8-bit codes."""
    g = torch.Generator().manual_seed(7)
    KVH, H, D, BS, NB = 2, 6, 64, 8, 24
    lens, qlens = [19, 40, 7], [1, 5, 7]
    x = torch.randn(NB * BS, 2, KVH, D, generator=g)
    kc = R.quantize_rows(x[:, 0], kt).reshape(NB, BS, KVH, -1)
    vc = R.quantize_rows(x[:, 1], vt).reshape(NB, BS, KVH, -1) if vt else x[:, 1].half().reshape(NB, BS, KVH, D)
    bt = torch.randperm(NB, generator=g).to(torch.int32)[:18].reshape(3, 6)
    q = torch.randn(sum(qlens), H, D, generator=g) * 2
    cu = torch.tensor([0, 1, 6, 13], dtype=torch.int32)
    kv_lens = torch.tensor(lens, dtype=torch.int32)
    for window in (0, 6):
        got = C.paged_attention(q, kc, vc, bt, cu, kv_lens, 0.125, window=window, k_type=kt, v_type=vt)
        want = R.paged_attention(q, kc, vc, bt, cu, kv_lens, 0.125, window=window, k_type=kt, v_type=vt)
        assert (got - want).abs().max().item() < 0.03, window
    # float64 attention of the dequantized caches, row by row (independent of kernels.ref)
    got = C.paged_attention(q, kc, vc, bt, cu, kv_lens, 0.125, k_type=kt, v_type=vt)
    kf, vf = R.cache_floats(kc, kt).double(), R.cache_floats(vc, vt).double()
    for s in range(3):
        keys = torch.cat([kf[b] for b in bt[s].long()])[:lens[s]]
        vals = torch.cat([vf[b] for b in bt[s].long()])[:lens[s]]
        for j in range(qlens[s]):
            pos = lens[s] - qlens[s] + j
            row = q[cu[s] + j].double().reshape(KVH, H // KVH, D)
            p = torch.softmax(torch.einsum("kgd,tkd->kgt", row, keys[:pos + 1]) * 0.125, -1)
            ref = torch.einsum("kgt,tkd->kgd", p, vals[:pos + 1]).reshape(H, D)
            assert (got[cu[s] + j].double() - ref).abs().max().item() < 0.03


@needs_c
def test_write_kv_skips_negative_slots_and_matches_the_reference():
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(5, 2, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    slots = torch.tensor([3, -1, 17, 0, 30])
    caches = []
    for impl in (C, R, torch_ref):  # torch_ref: the reference backend's write_kv routes to kv_quant_ref
        kc = torch.zeros(4, 8, 2, R.row_bytes(Q.Q4_1, 64), dtype=torch.uint8)
        vc = torch.zeros(4, 8, 2, 64, dtype=torch.float16)
        impl.write_kv(k, v, kc, vc, slots, k_type=Q.Q4_1, v_type=None)
        caches.append((kc, vc))
    for other in caches[1:]:
        assert torch.equal(caches[0][0], other[0]) and torch.equal(caches[0][1], other[1])
    assert int((caches[0][0].view(32, -1).abs().sum(-1) != 0).sum()) == 4  # 4 cells written, slot -1 skipped
    with pytest.raises(IndexError):
        C.write_kv(k, v, caches[0][0], caches[0][1], torch.tensor([0, 1, 2, 3, 32]), k_type=Q.Q4_1)

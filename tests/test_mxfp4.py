"""MXFP4 (GGML type 39, gpt-oss's expert weights): the reference dequantizer (kernels/dequant_ref.py)
against gguf-py's, which mirrors ggml-quants.c dequantize_row_mxfp4 (E8M0 half scales, edge exponents
0, 1, 2, 254, 255 included), bit for bit; the CPU matmul (kernels/cpu/mxfp4.c) against a replay of
llama.cpp's AVX2 repacked GEMV (gemv_q4_b32_8x8_q8_0_lut_avx: q8_0 activations, one fma per block
and output, in block order), bit for bit; the Triton dequantizer under the interpreter, bit for bit,
and its matmuls against float64."""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

import kernels
from kernels.cpu import matmul as cpu_matmul, native, qdot
from kernels.dequant_ref import KVALUES_MXFP4, dequantize, dequantize_blocks, e8m0_half
from kernels.qweight import QWeight

MXFP4 = GGMLQuantizationType.MXFP4


def _blocks(n: int, seed: int, exps=(118, 124)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, 17), dtype=np.uint8)
    b[:, 0] = rng.integers(*exps, size=n)
    return b


def _weight(rows: int, cols: int, seed: int) -> tuple[QWeight, np.ndarray]:
    b = _blocks(rows * cols // 32, seed)
    return QWeight(torch.from_numpy(b.reshape(rows, -1).copy()), MXFP4, rows, cols), b


def test_reference_dequant_equals_ggml():
    b = np.random.default_rng(0).integers(0, 256, size=(4096, 17), dtype=np.uint8)
    b[:5, 0] = [0, 1, 2, 254, 255]  # float32 subnormal scales, the largest finite one
    with np.errstate(over="ignore"):
        want = quants.MXFP4.dequantize_blocks(b)
    got = dequantize_blocks(torch.from_numpy(b), MXFP4).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert e8m0_half(torch.tensor([0, 1, 2, 128], dtype=torch.uint8)).tolist() == [2.0 ** -128, 2.0 ** -127,
                                                                                    2.0 ** -126, 1.0]


def _ggml_gemv(b: np.ndarray, rows: int, cols: int, x: torch.Tensor) -> np.ndarray:
    """llama.cpp's AVX2 MXFP4 GEMV replayed in numpy: isum per block exact, then
    acc = fma(float(isum), e8m0_half(e) * d_x, acc) (one rounding: float64 product and sum of float32s)."""
    a = qdot.quantize_activations(x, "q8_0")
    nb = cols // 32
    lut = np.array(KVALUES_MXFP4, dtype=np.int64)
    codes = np.stack([b[:, 1:] & 15, b[:, 1:] >> 4], 1).reshape(rows, nb, 32)
    e = e8m0_half(torch.from_numpy(b[:, 0].copy())).numpy().reshape(rows, nb)
    q = a.q.numpy().astype(np.int64).reshape(-1, nb, 32)
    isum = np.einsum("rbj,mbj->mrb", lut[codes], q).astype(np.float32)  # [M, rows, nb]
    scale = (e[None] * a.d.numpy()[:, None, :]).astype(np.float32)
    acc = np.zeros(isum.shape[:2], dtype=np.float32)
    for blk in range(nb):
        acc = (isum[:, :, blk].astype(np.float64) * scale[:, :, blk] + acc).astype(np.float32)
    return acc


@pytest.mark.skipif(native.lib() is None or not qdot.available(), reason="no C compiler")
@pytest.mark.parametrize("M", [1, 3, 9])
def test_cpu_matmul_is_llama_cpp_gemv(M):
    rows, cols = 40, 256
    w, b = _weight(rows, cols, seed=M)
    x = torch.randn(M, cols, generator=torch.Generator().manual_seed(M)) * 3
    assert cpu_matmul.prepare_weight(w, unpack_quantized=True) is w  # kept in its blocks
    y = kernels.Backend("cpu").qmatmul(x, w)
    assert np.array_equal(y.numpy(), _ggml_gemv(b, rows, cols, x))
    exact = x.double() @ dequantize(w).double().T
    assert (y.double() - exact).abs().max() < 0.02 * exact.abs().max()  # q8_0 activations: ~1%


def test_triton_dequant_and_matmul():
    rows, cols = 32, 128
    b = np.random.default_rng(5).integers(0, 256, size=(rows * cols // 32, 17), dtype=np.uint8)
    b[:5, 0] = [0, 1, 2, 254, 255]
    w = QWeight(torch.from_numpy(b.reshape(rows, -1).copy()), MXFP4, rows, cols)
    tb = kernels.Backend("triton")
    with np.errstate(over="ignore"):
        want = quants.MXFP4.dequantize_blocks(b).reshape(rows, cols)
    assert np.array_equal(tb.dequantize(w).numpy().view(np.uint32), want.view(np.uint32))
    w, _ = _weight(rows, cols, seed=7)
    W = dequantize(w).double()
    for M in (2, 24):  # the GEMV kernel and the tiled one
        x = torch.randn(M, cols, generator=torch.Generator().manual_seed(M))
        y = tb.qmatmul(x, w)
        assert (y.double() - x.double() @ W.T).abs().max() < 1e-5

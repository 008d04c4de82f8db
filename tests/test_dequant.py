"""kernels.dequant_ref against gguf.quants.dequantize (numpy port of ggml-quants.c)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

from kernels.dequant_ref import SUPPORTED_TYPES, dequantize, dequantize_blocks, dequantize_rows
from kernels.qweight import QWeight

QUANT_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# byte offsets of the f16 scale fields inside one block, per type
F16_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def random_blocks(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row_bytes] of random blocks whose f16 scales are finite, real values."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block_size
    blocks = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = rng.uniform(-0.05, 0.05, size=nb).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, cols // block_size * type_size)


def test_every_type_supported():
    for t in QUANT_TYPES + [T.F32, T.F16, T.BF16]:
        assert t in SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_dequant_matches_gguf(qtype, rows):
    rng = np.random.default_rng(1000 * int(qtype) + rows)
    block_size = GGML_QUANT_SIZES[qtype][0]
    cols = block_size * 3 if block_size == 256 else block_size * 7
    raw = random_blocks(qtype, rows, cols, rng)
    want = quants.dequantize(raw, qtype)  # [rows, cols] float32
    assert want.shape == (rows, cols)
    w = QWeight(torch.from_numpy(raw.copy()), qtype, rows, cols)
    got = dequantize(w)
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got.numpy(), want)

    # half precision output is the float32 result rounded
    got16 = dequantize(w, torch.float16)
    assert got16.dtype == torch.float16
    torch.testing.assert_close(got16, got.to(torch.float16))

    # row gather, repeated and out of order
    ids = torch.tensor([rows - 1, 0, rows // 2, rows - 1], dtype=torch.long)
    sub = dequantize_rows(w, ids)
    np.testing.assert_array_equal(sub.numpy(), want[ids.numpy()])


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_dequant_of_gguf_quantized_values(qtype):
    """Quantize real values with gguf and decode them back close to the input."""
    rng = np.random.default_rng(int(qtype))
    x = rng.normal(0, 1, size=(5, 128)).astype(np.float32)
    raw = quants.quantize(x, qtype)
    got = dequantize(QWeight(torch.from_numpy(raw), qtype, 5, 128)).numpy()
    np.testing.assert_array_equal(got, quants.dequantize(raw, qtype))
    tol = {T.Q8_0: 0.03, T.Q5_0: 0.15, T.Q5_1: 0.15}.get(qtype, 0.3)
    assert np.abs(got - x).max() < tol


def test_float_types():
    x = torch.randn(4, 64)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        w = QWeight.from_float(x.to(dt))
        got = dequantize(w)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, x.to(dt).float(), rtol=0, atol=0)
        ids = torch.tensor([3, 1])
        torch.testing.assert_close(dequantize_rows(w, ids), x.to(dt).float()[[3, 1]], rtol=0, atol=0)
    # BF16 bytes decode like gguf's BF16
    raw = x.to(torch.bfloat16).view(torch.uint8).numpy()
    np.testing.assert_array_equal(quants.dequantize(raw, T.BF16),
                                  dequantize(QWeight.from_float(x.to(torch.bfloat16))).numpy())


def test_blocks_shape_checked():
    with pytest.raises(ValueError):
        dequantize_blocks(torch.zeros(2, 33, dtype=torch.uint8), T.Q8_0)
    with pytest.raises(NotImplementedError):
        dequantize_blocks(torch.zeros(2, 66, dtype=torch.uint8), T.IQ2_XXS)


def test_chunked_large_table(monkeypatch):
    """Tables bigger than one chunk decode the same as in one go."""
    import kernels.dequant_ref as dr

    rng = np.random.default_rng(7)
    raw = random_blocks(T.Q4_K, 9, 512, rng)
    w = QWeight(torch.from_numpy(raw), T.Q4_K, 9, 512)
    full = dequantize(w)
    half = dequantize(w, torch.float16)
    monkeypatch.setattr(dr, "_CHUNK_ELEMS", 1024)  # 4 blocks a chunk: 18 blocks in 5 chunks
    np.testing.assert_array_equal(dequantize(w).numpy(), full.numpy())
    np.testing.assert_array_equal(dequantize(w, torch.float16).numpy(), half.numpy())
    ids = torch.tensor([8, 0, 3])
    np.testing.assert_array_equal(dequantize_rows(w, ids).numpy(), full[ids].numpy())

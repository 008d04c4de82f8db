"""The CPU batched-GEMV kernel and the weight layouts `prepare_weight` chooses."""
from __future__ import annotations

import pytest
import torch

from kernels import cpu_gemv, ref
from kernels.qweight import QWeight


@pytest.mark.skipif(not cpu_gemv.available(), reason="no C compiler on this machine")
@pytest.mark.parametrize("M,N,K", [(1, 1000, 256), (3, 777, 130), (8, 4097, 64), (16, 50, 7)])
def test_bgemv_matches_float64(M, N, K):
    x = torch.randn(M, K)
    w = torch.randn(N, K)
    tiles = cpu_gemv.pack(w)
    assert torch.equal(cpu_gemv.unpack(tiles, N), w)
    y = cpu_gemv.bgemv(x, tiles, N)
    ref64 = x.double() @ w.double().T
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert float((y.double() - ref64).norm() / ref64.norm()) < 1e-6


@pytest.mark.parametrize("rows,cols", [(300, 64), (4096, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prepared_weights_give_the_same_products(rows, cols, dtype):
    data = torch.randn(rows, cols).to(dtype)
    w = QWeight.from_float(data)
    p = ref.prepare_weight(w)
    assert p.data.dtype == torch.float32 and (p.rows, p.cols) == (rows, cols)
    big = rows * cols >= ref._BGEMV_MIN_ELEMS and cpu_gemv.available()
    assert p.layout == ("tiles64" if big else "cols")
    assert torch.equal(ref.dequantize(p), data.float())
    ids = torch.tensor([0, rows - 1, 5])
    assert torch.equal(ref.embedding(ids, p), data.float()[ids])
    for M in (1, 5, 9, 17, 40):
        x = torch.randn(M, cols)
        expect = x.double() @ data.double().T
        got = ref.qmatmul(x, p)
        assert float((got.double() - expect).norm() / expect.norm()) < 1e-5

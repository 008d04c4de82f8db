"""Dequantizing matmul y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF block format: the GEMV kernel
for decode batches (M <= 16, `qmatmul_gemv.py`), the `tl.dot` kernel for prefill
(`qmatmul_tiled.py`). Reference: `kernels.ref.qmatmul`."""
from __future__ import annotations

import torch

from .. import ref
from ..qweight import QWeight
from .qmatmul_gemv import GEMV_MAX_M, qmatmul_gemv
from .qmatmul_tiled import qmatmul_tiled

reference = ref.qmatmul


def qmatmul(x: torch.Tensor, w: QWeight) -> torch.Tensor:
    """y[M, N] = x[M, K] @ dequant(W)^T in x.dtype."""
    M, K = x.shape
    assert K == w.cols, (x.shape, w.cols)
    y = torch.empty(M, w.rows, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    return qmatmul_gemv(x, w, y) if M <= GEMV_MAX_M else qmatmul_tiled(x, w, y)

"""The Triton backend: the ops of the dispatch surface (docs/DESIGN.md) as Triton kernels, for CUDA
tensors (and CPU tensors under TRITON_INTERPRET=1). Imported only when a Triton op is first asked
for (`kernels.Backend`), so a CPU-only engine never imports triton and tests can set
TRITON_INTERPRET before the kernels are decorated.

One kernel per file, its torch reference (`kernels.ref`) named as `reference` at the top and its
autotune configs beside it:

| file | kernel |
| --- | --- |
| `dequant.py` | `_dequant_rows_kernel`: `dequantize`, `embedding` |
| `qmatmul_gemv.py` | `_qmm_gemv_kernel`: `qmatmul` for M <= 16 |
| `qmatmul_tiled.py` | `_qmm_tiled_kernel` (`tl.dot`): `qmatmul` for larger M |
| `paged_decode.py` | `_paged_decode_kernel`: `paged_attention` when every q_len is 1 (split-K) |
| `merge_splits.py` | `_merge_splits_kernel`: merges the split-K partials |
| `paged_prefill.py` | `_paged_prefill_kernel`: `paged_attention` for prefill / mixed batches |
| `norm.py` | `_rms_norm_kernel`: `rms_norm`, `add_rms_norm` |
| `rope.py` | `_rope_kernel` |
| `silu_mul.py` | `_silu_mul_kernel` |
| `write_kv.py` | `_write_kv_kernel` |

plus the shared device functions `gguf_tl.py` (GGUF block dequantization in registers) and
`attend_tile.py` (one online-softmax step), and the two dispatchers `qmatmul.py` (GEMV or tiled)
and `attention.py` (decode or prefill).
"""
from __future__ import annotations

import torch

from ..qweight import QWeight
from ..ref import packs_quantized, prepare_topk_head, topk  # noqa: F401  (device-agnostic torch)
from .attention import paged_attention  # noqa: F401
from .dequant import dequantize, embedding  # noqa: F401
from .norm import add_rms_norm, rms_norm  # noqa: F401
from .qmatmul import qmatmul
from .rope import rope  # noqa: F401
from .silu_mul import silu_mul  # noqa: F401
from .write_kv import write_kv  # noqa: F401


def prepare_weight(w: QWeight, unpack_quantized: bool = False, pack_quantized: bool = True) -> QWeight:
    """The Triton kernels read the GGUF block format as it is: nothing to prepare."""
    return w


def topk_logits(x: torch.Tensor, w: QWeight, head, topk: list[int], banned: list[tuple[int, ...]]) -> torch.Tensor:
    """Every row exact (no top-k head on this backend: `prepare_topk_head` gives None)."""
    return qmatmul(x, w).float()

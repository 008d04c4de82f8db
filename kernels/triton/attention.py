"""Dispatch between the decode and prefill paged-attention kernels."""
from __future__ import annotations

import torch

from .. import ref
from .paged_decode import paged_decode
from .paged_prefill import paged_prefill

reference = ref.paged_attention


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float,
                    softcap: float = 0.0, max_q_len: int | None = None) -> torch.Tensor:
    """Same contract as `kernels.ref.paged_attention`. Without `max_q_len`, one host sync reads
    the longest query run."""
    T = q.shape[0]
    S = kv_lens.shape[0]
    out = torch.empty_like(q)
    if T == 0 or S == 0:
        return out
    cu = cu_seqlens_q.to(device=q.device, dtype=torch.int32).contiguous()
    lens = kv_lens.to(device=q.device, dtype=torch.int32).contiguous()
    bt = block_tables.to(device=q.device, dtype=torch.int32)
    if max_q_len is None:
        max_q_len = int((cu[1:] - cu[:-1]).max().item())
    if max_q_len == 1:
        return paged_decode(q, k_cache, v_cache, bt, cu, lens, scale, softcap, out=out)
    return paged_prefill(q, k_cache, v_cache, bt, cu, lens, scale, softcap, max_q_len=max_q_len, out=out)

"""Paged decode attention for the CPU path (C, `cpu_native`): one query per sequence, every
sequence's keys and values read straight from the block-allocated cache through its block table
(no gather copy), float32 scores and softmax, GQA, optional tanh soft-capping.
Reference: `kernels.ref.paged_attention` with all q_len == 1."""
from __future__ import annotations

import torch

from . import cpu_native


def supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (cpu_native.lib() is not None and q.device.type == "cpu" and k_cache.device.type == "cpu"
            and k_cache.dtype in (torch.float16, torch.float32) and k_cache.is_contiguous()
            and k_cache.shape[-1] <= cpu_native.MAX_HEAD_DIM)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 kv_lens: list[int], scale: float, softcap: float = 0.0) -> torch.Tensor:
    """q: [S, H, D]; caches [NB, BS, KVH, D]; block_tables [S, MAXB] int32 -> [S, H, D] float32."""
    lib = cpu_native.lib()
    S, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    qf = q.float().contiguous()
    bt = block_tables.to(torch.int32).contiguous()
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    max_l = max(kv_lens)
    out = torch.empty((S, H, D), dtype=torch.float32)
    scratch = torch.empty((S * KVH, H // KVH, max_l), dtype=torch.float32)
    lib.paged_decode(qf.data_ptr(), k_cache.data_ptr(), v_cache.contiguous().data_ptr(), bt.data_ptr(),
                     bt.shape[1], lens.data_ptr(), out.data_ptr(), scratch.data_ptr(), S, H, KVH, D, BS, max_l,
                     float(scale), float(softcap), int(k_cache.dtype == torch.float16), torch.get_num_threads())
    return out

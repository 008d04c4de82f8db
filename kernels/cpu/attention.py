"""Paged attention on the CPU (reference: `kernels.ref.paged_attention`).

Every query row is one decode item of a C kernel: its sequence's keys and values read straight
from the block-allocated cache through its block table (no gather copy), GQA, optional tanh
soft-capping. A forward of fewer than 64 query rows (every decode step, short prompts) goes to
`fattn.c`, llama.cpp's CPU flash attention for such batches bit for bit (float16 query and
accumulator, online softmax); larger ones to `attention.c` (float32 scores and softmax, the same
bits on every instruction-set build), as llama.cpp takes its float32 tiles there. A prompt row is
the decode of its position (its own key count, the sequence's table): under 64 rows a token's
attention gives the same bits whether its prompt ran in one batch, in chunks, or after a cached
prefix, as llama.cpp's (a repeated greedy request with a cached prompt continued differently
before). In `Numerics.OWN` (the backend's, fixed when it is built) every row goes to attention.c.
Without the compiled kernels, several decode sequences go through one padded torch gather
while that stays small; everything else through the reference.
"""
from __future__ import annotations

import torch

from .. import ref
from ..numerics import Numerics
from . import native

# Batched decode attention pads every sequence to the longest; only do it while the padded KV
# gather stays below this many elements.
_BATCHED_DECODE_MAX_ELEMS = 1 << 26
# Prompt rows go to the decode kernel in chunks whose score scratch (rows x heads x keys floats)
# stays under this many elements.
_ROWS_SCRATCH_ELEMS = 1 << 23
# ggml's flash attention takes batches of this many query rows or more through float32 tiles
# (ggml_fa_tile_config::Q), fewer row by row with float16 roundings (fattn.c).
FA_TILE_Q = 64


def supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    return (native.lib() is not None and q.device.type == "cpu" and k_cache.device.type == "cpu"
            and k_cache.dtype in (torch.float16, torch.float32) and k_cache.is_contiguous()
            and k_cache.shape[1] & (k_cache.shape[1] - 1) == 0)  # power-of-2 blocks (the C kernel shifts)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 kv_lens: list[int] | torch.Tensor, scale: float, softcap: float = 0.0,
                 n_threads: int | None = None, window: int = 0, team: bool = False,
                 flash: bool | None = None, numerics: Numerics = Numerics.GGML,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q: [S, H, D]; caches [NB, BS, KVH, D]; block_tables [S, MAXB] int32; kv_lens: [S] (list or
    tensor) -> [S, H, D] float32. `n_threads`: threads (default torch's count); window > 0: only
    the last `window` keys of each sequence. `team`: on the OpenMP team instead of pool.c's
    helpers (same bits), for callers between OpenMP regions whose threads still spin. `flash`:
    fattn.c or attention.c (default: `flash_rows(S, numerics)`). `sinks` [H] float32 (fattn.c only):
    gpt-oss's attention sinks, as ggml's flash attention applies them."""
    lib = native.lib()
    S, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    qf = q if q.dtype == torch.float32 and q.is_contiguous() else q.float().contiguous()
    bt = block_tables if block_tables.dtype == torch.int32 and block_tables.is_contiguous() \
        else block_tables.to(torch.int32).contiguous()
    lens = torch.as_tensor(kv_lens, dtype=torch.int32).contiguous()
    out = torch.empty((S, H, D), dtype=torch.float32)
    if sinks is not None:
        sk = sinks.float().contiguous()
        lib.fattn_rows_sinks(qf.data_ptr(), k_cache.data_ptr(), v_cache.contiguous().data_ptr(), bt.data_ptr(),
                             bt.shape[1], lens.data_ptr(), out.data_ptr(), S, H, KVH, D, BS, float(scale),
                             float(softcap), int(k_cache.dtype == torch.float16), n_threads or torch.get_num_threads(),
                             int(window), int(team), sk.data_ptr())
        return out
    if flash_rows(S, numerics) if flash is None else flash:
        lib.fattn_rows(qf.data_ptr(), k_cache.data_ptr(), v_cache.contiguous().data_ptr(), bt.data_ptr(),
                       bt.shape[1], lens.data_ptr(), out.data_ptr(), S, H, KVH, D, BS, float(scale), float(softcap),
                       int(k_cache.dtype == torch.float16), n_threads or torch.get_num_threads(), int(window),
                       int(team))
        return out
    max_l = int(lens.max())
    scratch = torch.empty((S * KVH, H // KVH, max_l), dtype=torch.float32)
    (lib.paged_decode_team if team else lib.paged_decode)(qf.data_ptr(), k_cache.data_ptr(), v_cache.contiguous().data_ptr(), bt.data_ptr(),
                     bt.shape[1], lens.data_ptr(), out.data_ptr(), scratch.data_ptr(), S, H, KVH, D, BS, max_l,
                     float(scale), float(softcap), int(k_cache.dtype == torch.float16),
                     n_threads or torch.get_num_threads(), int(window))
    return out


def flash_rows(n_rows: int, numerics: Numerics = Numerics.GGML) -> bool:
    """Whether a forward of `n_rows` query rows takes fattn.c (llama.cpp's row-by-row flash attention,
    as llama-server does below FA_TILE_Q rows): in llama.cpp's numerics only."""
    return n_rows < FA_TILE_Q and numerics is Numerics.GGML


def _decode_batched(q, k_cache, v_cache, block_tables, lens, scale, softcap, window=0):
    """All sequences have one query. q[S, H, D] -> [S, H, D] float32."""
    S, H, D = q.shape
    NB, BS, KVH, _ = k_cache.shape
    G = H // KVH
    maxL = max(lens)
    nb = (maxL + BS - 1) // BS
    bt = block_tables[:, :nb].long().clamp(0, NB - 1)  # entries past a sequence's end are masked
    k = k_cache[bt].reshape(S, nb * BS, KVH, D).float()  # [S, Lp, KVH, D]
    v = v_cache[bt].reshape(S, nb * BS, KVH, D).float()
    qh = q.float().reshape(S, KVH, G, D)
    s = torch.einsum("skgd,slkd->skgl", qh, k) * scale  # [S, KVH, G, Lp]
    if softcap > 0.0:
        s = softcap * torch.tanh(s / softcap)
    lens_t = torch.tensor(lens, device=q.device)
    kpos = torch.arange(nb * BS, device=q.device)[None, :]
    valid = kpos < lens_t[:, None]  # [S, Lp]
    if window > 0:  # the query sits at lens - 1 and sees keys at positions >= lens - window
        valid &= kpos >= lens_t[:, None] - window
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("skgl,slkd->skgd", p, v)
    return o.reshape(S, H, D)


def paged_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               cu: list[int], lens: list[int], scale: float, softcap: float = 0.0, window: int = 0,
               numerics: Numerics = Numerics.GGML, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Every query row as a decode item of `paged_decode`: row j of sequence s (rows cu[s]:cu[s+1])
    sits at position lens[s] - q_len + j and reads keys 0 .. that position through table s.
    q: [T, H, D] -> [T, H, D] float32 (rows past cu[-1]: zeros)."""
    T, H, D = q.shape
    S = len(lens)
    qf = q.float().contiguous()
    out = torch.zeros((T, H, D), dtype=torch.float32)
    n = cu[S] - cu[0]
    flash = flash_rows(n, numerics)  # llama.cpp's choice for the whole batch
    if not flash and softcap == 0.0 and numerics is Numerics.GGML and _tiled(qf, k_cache, v_cache, block_tables, cu,
                                                                             lens, scale, window, out):
        return out
    q_lens = torch.tensor([cu[s + 1] - cu[s] for s in range(S)], dtype=torch.int64)
    seq = torch.repeat_interleave(torch.arange(S), q_lens)  # [T'] the sequence of each row
    starts = torch.tensor(cu[:S], dtype=torch.int64)
    row_lens = (torch.tensor(lens, dtype=torch.int64)[seq] - q_lens[seq]
                + torch.arange(cu[S] - cu[0]) - (starts[seq] - cu[0]) + 1).to(torch.int32)
    bt = block_tables.to(torch.int32)[seq].contiguous()  # [T', MAXB]
    rows = max(1, _ROWS_SCRATCH_ELEMS // (H * max(1, int(row_lens.max()))))  # per call: bounded score scratch
    for i in range(0, n, rows):
        r0, r1 = cu[0] + i, cu[0] + min(i + rows, n)
        # on the OpenMP team: the prompt's matmuls (qdot, BLAS) leave its threads spinning, and a
        # woken pool helper would share a core with one of them (2 cores: 13.4 -> 7 ms a call)
        out[r0:r1] = paged_decode(qf[r0:r1], k_cache, v_cache, bt[i:i + rows], row_lens[i:i + rows], scale,
                                  softcap, window=window, team=True, flash=flash, sinks=sinks)
    return out


def _tiled(qf, k_cache, v_cache, block_tables, cu, lens, scale, window, out) -> bool:
    """Batches of FA_TILE_Q rows or more as llama.cpp's tiled flash attention (fattn.c
    `fattn_tiled_seq`, one call per sequence) into `out`; False where the CPU or the shapes rule it
    out, which the first call finds before it writes anything. qf: [T, H, D] float32, contiguous."""
    lib = native.lib()
    isa = {"avx512": 2, "avx2": 1}.get(native.ggml_vector_order(), 0)  # llama.cpp's build's branch here
    T, H, D = qf.shape
    NB, BS, KVH, _ = k_cache.shape
    bt = block_tables.to(torch.int32).contiguous()
    v = v_cache.contiguous()
    f16 = int(k_cache.dtype == torch.float16)
    for s in range(len(lens)):
        n = cu[s + 1] - cu[s]
        if n == 0:
            continue
        if lib.fattn_tiled_seq(qf[cu[s]].data_ptr(), k_cache.data_ptr(), v.data_ptr(), bt[s].data_ptr(), n,
                               lens[s] - n, out[cu[s]].data_ptr(), H, KVH, D, BS, float(scale), f16,
                               torch.get_num_threads(), int(window), 1, isa):
            return False
    return True


def paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale: float, softcap: float = 0.0,
                    max_q_len: int | None = None, window: int = 0, k_type=None, v_type=None,
                    sinks: torch.Tensor | None = None, numerics: Numerics = Numerics.GGML) -> torch.Tensor:
    """The contract of `kernels.ref.paged_attention`; the lengths are read on the host; `numerics`:
    the backend's (kernels.Backend binds it). A quantized cache (k_type / v_type): kv_quant.py
    (llama.cpp's order in either numerics: its only CPU path for such caches, sinks too). With
    `sinks` (gpt-oss): batches under 64 query rows through fattn.c (llama.cpp's row-by-row flash
    attention with its sinks, bit for bit), larger ones through the reference (float32; llama.cpp's
    tiled order with sinks is not reproduced)."""
    if k_type is not None or v_type is not None:
        from .kv_quant import paged_attention as attend_quant
        return attend_quant(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap, max_q_len,
                            window, k_type, v_type, sinks)
    cu = cu_seqlens_q.tolist()
    lens = kv_lens.tolist()
    S = len(lens)
    decode_only = S > 0 and all(cu[s + 1] - cu[s] == 1 for s in range(S)) and cu[0] == 0 and min(lens) > 0
    if sinks is not None:
        if (S > 0 and supported(q, k_cache) and flash_rows(cu[S] - cu[0], numerics)
                and all(0 <= cu[s + 1] - cu[s] <= lens[s] for s in range(S))):
            if decode_only:
                out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
                out[:S] = paged_decode(q[:S], k_cache, v_cache, block_tables, kv_lens, scale, softcap, window=window,
                                       numerics=numerics, sinks=sinks).to(q.dtype)
                return out
            return paged_rows(q, k_cache, v_cache, block_tables, cu, lens, scale, softcap, window, numerics,
                              sinks).to(q.dtype)
        return ref.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap,
                                   max_q_len, window, sinks=sinks)
    if not decode_only and S > 0 and supported(q, k_cache) and all(
            0 <= cu[s + 1] - cu[s] <= lens[s] for s in range(S)):  # prompt rows: each as its position's decode
        return paged_rows(q, k_cache, v_cache, block_tables, cu, lens, scale, softcap, window, numerics).to(q.dtype)
    if decode_only and supported(q, k_cache):  # C kernel, reads the blocks in place
        if q.shape[0] == S and q.dtype == torch.float32:
            return paged_decode(q, k_cache, v_cache, block_tables, kv_lens, scale, softcap, window=window,
                                numerics=numerics)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        out[:S] = paged_decode(q[:S], k_cache, v_cache, block_tables, kv_lens, scale, softcap,
                               window=window, numerics=numerics).to(q.dtype)
        return out
    if S > 1 and decode_only:
        NB, BS, KVH, D = k_cache.shape
        nb = (max(lens) + BS - 1) // BS
        if S * nb * BS * KVH * D <= _BATCHED_DECODE_MAX_ELEMS:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            out[:S] = _decode_batched(q[:S], k_cache, v_cache, block_tables, lens, scale, softcap,
                                      window).to(q.dtype)
            return out
    return ref.paged_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, kv_lens, scale, softcap, max_q_len,
                               window)

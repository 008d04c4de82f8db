"""A decode step's decoder layers on the CPU as one loop of direct C calls (`fused_decoder`).

Why: after each matmul has streamed its weights (tens of MB per layer), the interpreter's and
torch's own code and data are out of the caches, and each torch call of the per-op wrappers costs
~5-40 us instead of ~1 (measured on the 1.5B-shaped Q4_K_M model: `add_rms_norm` 44 us right
after a matmul, 10 us hot; the same C call with its pointers ready 6 us). A decode step of 28
layers made ~450 such calls, ~10 ms of an ~85 ms step. Here the buffers are allocated once per
step, the pointers of the weights once at build, and every layer is 8 C calls:

    add_rms_norm -> qkv matmul -> bias + q/k norm + RoPE + KV write -> paged attention
    -> o matmul [-> rms_norm] -> add_rms_norm -> gate/up matmul -> SwiGLU or GeGLU -> down matmul
    [-> rms_norm]

The same C functions (or, for the q/k/v step, `qkv_rope_store_f32`: the same operations in the
same order as the bias add, `rms_norm`, `rope` and `write_kv` it replaces) on the same inputs as
the per-op path of `runtime.model.decoder.Model._layers`: the results are bit-identical
(tests/test_cpu_decoder.py). Layers qualify when every matmul is an x8 qdot group or float 64-row
GEMV tiles (`DecoderLayer`; with tiles, at most `gemv.MAX_M` sequences: `Decoder.max_rows`);
post-norms (gemma), sliding windows with their own cache pool and soft-capped scores are handled;
experts, LoRA and -tp keep the per-op path.
"""
from __future__ import annotations

import torch

from .. import ref
from ..decoder import DecoderLayer, DecoderShape
from ..numerics import Numerics
from ..qweight import QWeight
from . import attention, gemv, native, pointwise
from .matmul import _BGEMV_MT_MIN_ELEMS  # the per-op path's one-thread bound for float tiles


def _f32_vector(t: torch.Tensor | None, n: int) -> bool:
    return t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
                         and tuple(t.shape) == (n,))


def _matmul_ok(w: QWeight, rows: int, cols: int) -> bool:
    """An x8 qdot group, or float 64-row tiles (the GEMV the per-op path runs at decode sizes)."""
    return w.rows == rows and w.cols == cols and (w.layout == "x8" or (w.layout == "tiles64"
                                                                         and w.data.dtype in gemv._KERNELS))


def fused_decoder(layers: list[DecoderLayer], shape: DecoderShape,
                  numerics: Numerics = Numerics.GGML) -> "Decoder | None":
    """The fused decode loop over `layers`, or None when this machine or these weights do not
    qualify (no compiled kernels, a weight neither a qdot x8 group nor float tiles, odd shapes).
    `numerics`: its attention's (the backend's; its qdot groups carry theirs from their prepare)."""
    lib = native.lib()
    H, KVH, D, C, F = shape.n_head, shape.n_head_kv, shape.head_dim, shape.n_embd, shape.n_ff
    if lib is None or not layers or H % KVH or D > 1024 or shape.act not in ("silu", "gelu"):
        return None
    nqkv = (H + 2 * KVH) * D
    for L in layers:
        R = L.inv_freq.shape[0]
        if not (_matmul_ok(L.wqkv, nqkv, C) and _matmul_ok(L.wo, C, H * D) and _matmul_ok(L.w_gate_up, 2 * F, C)
                and _matmul_ok(L.w_down, C, F) and 2 * R <= D and R <= pointwise.MAX_ROPE_PAIRS
                and L.window >= 0
                and all(_f32_vector(t, n) for t, n in ((L.attn_norm, C), (L.ffn_norm, C), (L.bqkv, nqkv),
                                                        (L.q_norm, D), (L.k_norm, D), (L.inv_freq, R),
                                                        (L.post_attn_norm, C), (L.post_ffn_norm, C)))):
            return None
    return Decoder(lib, layers, shape, numerics)


def _matmul(m: tuple, x: int, S: int, y: int, nt: int) -> None:
    """y[S, rows] = x[S, cols] @ W^T for one weight of `Decoder._ptrs` (x and y contiguous)."""
    qdot_group, fn, w, rows, cols, wnt = m
    if qdot_group:
        if fn(w, x, cols, S, y, rows, nt):
            raise RuntimeError("qdot: matmul failed")
    else:
        fn(x, w, None, y, S, S, rows, cols, rows, wnt or nt)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class Decoder:
    """`decoder(h, k_caches, v_caches, pos, slots, tables, kv_lens)`: one query row per sequence."""

    def __init__(self, lib, layers: list[DecoderLayer], shape: DecoderShape, numerics: Numerics = Numerics.GGML):
        self.shape = shape
        self.numerics = numerics
        self._layers = layers  # keeps the tensors behind the pointers alive
        s = shape
        all_qdot = all(w.layout == "x8" for L in layers for w in (L.wqkv, L.wo, L.w_gate_up, L.w_down))
        # attention on the thread team its matmuls use: OpenMP for qdot (attention.c paged_decode_team),
        # pool.c where float GEMV tiles are among them (the per-op path's choice for those models)
        self._norm, self._qkv_post = lib.add_rms_norm_f32, lib.qkv_rope_store_f32
        self._attend = lib.paged_decode_team if all_qdot else lib.paged_decode
        self._fattn, self._fattn_omp = lib.fattn_rows, int(all_qdot)  # llama.cpp's flash attention (fattn.c)
        # float tiles only at decode sizes: above, the per-op path may take BLAS (other sums)
        self.max_rows = None if all_qdot else gemv.MAX_M
        # the FFN's gate in C where the per-op path's is C too (else the reference's torch, same bits)
        if s.act == "gelu":
            self._gelu_table = pointwise.gelu_table()
            self._act_c, self._act = True, lib.gelu_table_mul_f32
            self._act_args = (self._gelu_table.data_ptr(),)
        else:
            name = pointwise.swiglu_name() or "swiglu_f32"  # (unused when not _act_c)
            self._act_c, self._act, self._act_args = pointwise.swiglu_in_c(), getattr(lib, name), ()

        def mm(w: QWeight) -> tuple:  # (qdot?, C function, weight pointer, rows, cols, threads or None)
            if w.layout == "x8":
                return (True, w.kernel._fn, w.kernel._ptr, w.rows, w.cols, None)
            return (False, getattr(lib, gemv._KERNELS[w.data.dtype]), w.data.data_ptr(), w.rows, w.cols,
                    1 if w.rows * w.cols < _BGEMV_MT_MIN_ELEMS else None)

        # per layer: (attn_norm, qkv, bias, q_norm, k_norm, inv_freq, R, wo, ffn_norm, gate/up, down,
        # post_attn_norm, post_ffn_norm, window, rope theta_scale, rope mscale)
        self._ptrs = [(L.attn_norm.data_ptr(), mm(L.wqkv), _ptr(L.bqkv), _ptr(L.q_norm), _ptr(L.k_norm),
                       L.inv_freq.data_ptr(), L.inv_freq.shape[0], mm(L.wo), L.ffn_norm.data_ptr(), mm(L.w_gate_up),
                       mm(L.w_down), _ptr(L.post_attn_norm), _ptr(L.post_ffn_norm), L.window, L.rope_theta_scale,
                       L.rope_mscale)
                      for L in layers]
        self._nqkv = (s.n_head + 2 * s.n_head_kv) * s.head_dim
        self._checked, self._ok = None, False
        self._kv_ptrs: list[tuple[int, int, int]] = []  # per layer (K, V, slots), with _checked

    def supports(self, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> bool:
        """Whether the caches are what the C attention reads: one K and one V per layer, float16 or
        float32, contiguous, [NB, BS, KVH, D] with one BS (a power of 2) and dtype for all (NB may
        differ: a sliding-window pool). Checked once per pair of lists."""
        key = (id(k_caches), id(v_caches), k_caches[0].data_ptr() if k_caches else 0)
        if key != self._checked:
            s, k = self.shape, k_caches[0] if k_caches else None
            ok = (k is not None and len(k_caches) == len(v_caches) == len(self._layers) and k.device.type == "cpu"
                  and k.dtype in (torch.float16, torch.float32) and k.dim() == 4 and k.shape[1] & (k.shape[1] - 1) == 0
                  and all(t.dim() == 4 and tuple(t.shape[1:]) == (k.shape[1], s.n_head_kv, s.head_dim)
                          and t.dtype == k.dtype and t.is_contiguous() for t in (*k_caches, *v_caches))
                  and all(a.shape == b.shape for a, b in zip(k_caches, v_caches)))
            self._checked, self._ok = key, ok
            self._kv_ptrs = [(a.data_ptr(), b.data_ptr(), a.shape[0] * a.shape[1]) for a, b in zip(k_caches, v_caches)] \
                if ok else []
        return self._ok

    def __call__(self, h: torch.Tensor, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                 pos: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor, kv_lens: torch.Tensor,
                 is_swa: list[bool] | None = None, swa_slots: torch.Tensor | None = None,
                 swa_tables: torch.Tensor | None = None) -> torch.Tensor:
        """h: [S, C] float32 embeddings of one new token per sequence; pos / slots [S]; tables
        [S, MAXB] int32; kv_lens [S] (the new token included). Layers flagged in `is_swa` keep their
        K/V in a sliding-window pool: `swa_slots` / `swa_tables` instead. Writes each layer's K/V
        to its slot and returns the final residual stream [S, C] (as `Model._layers`)."""
        s = self.shape
        if not self.supports(k_caches, v_caches):
            raise ValueError("fused decoder: KV caches it cannot read (see supports())")
        S, C = h.shape
        H, KVH, D, F, nqkv = s.n_head, s.n_head_kv, s.head_dim, s.n_ff, self._nqkv
        BS = k_caches[0].shape[1]
        f16 = int(k_caches[0].dtype == torch.float16)
        nt = torch.get_num_threads()
        h = h.float().contiguous()
        pos = pos.to(torch.int64).contiguous()
        lens = kv_lens.to(torch.int32).contiguous()
        max_l = int(lens.max())
        # (slots, block tables) of the main pool and, when some layers live in it, of the SWA pool
        pools = [(slots.to(torch.int64).contiguous(), tables.to(torch.int32).contiguous())]
        if is_swa is not None and any(is_swa):
            if swa_slots is None or swa_tables is None:
                raise ValueError("fused decoder: sliding-window layers without their pool's slots and tables")
            pools.append((swa_slots.to(torch.int64).contiguous(), swa_tables.to(torch.int32).contiguous()))
        pool_args = [(sl.data_ptr(), bt.data_ptr(), bt.shape[1]) for sl, bt in pools]
        which = [1 if is_swa is not None and is_swa[i] and len(pools) > 1 else 0 for i in range(len(self._ptrs))]
        f32 = torch.float32
        x, hb, hn = (torch.empty((S, C), dtype=f32) for _ in range(3))
        res = [h, torch.empty((S, C), dtype=f32), torch.empty((S, C), dtype=f32)]  # residual: ping-pong
        qkv, q = torch.empty((S, nqkv), dtype=f32), torch.empty((S, H * D), dtype=f32)
        att, gu = torch.empty((S, H * D), dtype=f32), torch.empty((S, 2 * F), dtype=f32)
        a = torch.empty((S, F), dtype=f32)
        flash, fattn, omp = attention.flash_rows(S, self.numerics), self._fattn, self._fattn_omp
        scratch = None if flash else torch.empty((S * KVH, H // KVH, max_l), dtype=f32)  # attend's scores
        px, phb, phn, pqkv, pq, patt, pgu, pa = (t.data_ptr() for t in (x, hb, hn, qkv, q, att, gu, a))
        pr = [t.data_ptr() for t in res]
        ppos, plens, psc = pos.data_ptr(), lens.data_ptr(), 0 if scratch is None else scratch.data_ptr()
        norm, qkv_post, attend, act, act_args = self._norm, self._qkv_post, self._attend, self._act, self._act_args
        eps, neox, softcap = s.eps, int(s.neox), s.softcap
        prescale = s.prescale_q  # q *= s.scale after the RoPE, then attention at scale 1 (llama.cpp's gemma)
        scale = 1.0 if prescale else s.scale
        cur = 0  # index in res of the residual stream (0: the embeddings, before the first layer)
        ph = phb  # the block output added to the residual next: hb, or hn after a post-norm
        for (pn1, mqkv, pb, pqn, pkn, pf, R, mo, pn2, mgu, md, ppa, ppf, win, ts, ms), (pk, pv, n_slots), w in zip(
                self._ptrs, self._kv_ptrs, which):
            pslots, pbt, maxb = pool_args[w]
            nxt = 1 if cur != 1 else 2
            if cur == 0:  # the first layer: x = rms_norm(h); residual = h
                norm(pr[0], None, pn1, px, None, S, C, eps, nt)
            else:  # residual += h; x = rms_norm(residual)
                norm(ph, pr[cur], pn1, px, pr[nxt], S, C, eps, nt)
                cur = nxt
            _matmul(mqkv, px, S, pqkv, nt)
            bad = qkv_post(pqkv, nqkv, pb, pqn, pkn, eps, ppos, pf, R, neox, ts, ms, S, H, KVH, D, pq, pk, pv, pslots,
                           f16, n_slots)
            if bad != -1:  # -2: sizes past the C buffers (fused_decoder refuses such layers)
                raise (IndexError(f"write_kv: slot {bad} is outside the cache ({n_slots} slots)") if bad >= 0
                       else ValueError("fused decoder: head_dim or RoPE pairs past the C kernel's bounds"))
            if prescale:
                q.mul_(s.scale)
            if flash:
                fattn(pq, pk, pv, pbt, maxb, plens, patt, S, H, KVH, D, BS, scale, softcap, f16, nt, win, omp)
            else:
                attend(pq, pk, pv, pbt, maxb, plens, patt, psc, S, H, KVH, D, BS, max_l, scale, softcap, f16, nt, win)
            _matmul(mo, patt, S, phb, nt)
            ph = phb
            if ppa is not None:  # h = rms_norm(h) (gemma)
                norm(phb, None, ppa, phn, None, S, C, eps, nt)
                ph = phn
            nxt = 1 if cur != 1 else 2
            norm(ph, pr[cur], pn2, px, pr[nxt], S, C, eps, nt)
            cur = nxt
            _matmul(mgu, px, S, pgu, nt)
            if self._act_c:
                act(pgu, pgu + 4 * F, pa, *act_args, F, 2 * F, 2 * F, F, S, nt)
            else:  # the reference's SiLU (pointwise.silu_mul does the same on such a CPU)
                a.copy_(ref.silu_mul(gu[:, :F], gu[:, F:]))
            _matmul(md, pa, S, phb, nt)
            ph = phb
            if ppf is not None:
                norm(phb, None, ppf, phn, None, S, C, eps, nt)
                ph = phn
        return (hn if ph == phn else hb) + res[cur]

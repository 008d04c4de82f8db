"""The K/V tensors of the paged KV cache: the model room's half of it.

Layout (one definition, see docs/DESIGN.md): per layer `k[l], v[l]: [num_blocks, block_size, n_kv_heads, head_dim]`.
A sequence's block table (`SeqKV`, plain data) lists its blocks in order; token i of the sequence
lives in block `blocks[i // block_size]` at offset `i % block_size` (flat slot `block * block_size
+ offset`), so its position equals its index. Keys are stored already rotated by RoPE at that position.

`KVStore` holds the tensors and moves data between the blocks a table names: it computes slot
mappings and block tables from the table it is handed, copies a block, gathers and scatters K/V
by flat slots, re-rotates moved keys and turns a sequence's K/V into host rows (`KVState`) and
back. It decides nothing about which block is whose: block tables are written only by the serving
room's block manager (`runtime/serving/blocks.py`), which reserves, shares and frees the blocks.

Sliding-window layers (gemma2/3's local layers; `windows` given, i.e. not --swa-full) live in a
second, smaller pool of blocks (K/V tensors `[num_swa_blocks + 1, block_size, KVH, D]` for those
layers), addressed through the table's `swa_blocks` (indexed like `blocks`), whose entries for
blocks that fell out of the window are `NULL_BLOCK` (block 0 of that pool, never handed out and
all zeros); the attention kernels mask keys before p - W + 1, so they read what they read with
the full cache. `read_window` / `write_window` copy those layers' rows to and from the host (the
window a context checkpoint keeps, `SeqKV.swa_ckpt`).

Hybrid models (qwen35 / qwen35moe: gated linear-attention layers beside full attention) keep each
sequence's recurrent state in a `runtime.model.recurrent.RecurrentStore` held here as `rs` (its
`recurrent_layers` hold no K/V); the table's `SeqKV.rs` names the sequence's cell, `SeqKV.rs_ckpt`
its context checkpoints (host copies of the state). `cell_ext`: M-RoPE models, whose slot files
carry llama.cpp's cell ext.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from typing import Any

import torch
from gguf import GGMLQuantizationType

import kernels

NULL_BLOCK = 0  # the SWA pool's never-allocated zero block: table entries of dropped blocks

# the ggml types of the float caches (llama.cpp's -ctk / -ctv f32 | f16 | bf16); the quantized ones
# (q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl) keep per layer uint8 [NB, BS, KVH, row_bytes] of GGML blocks
# (kernels/kv_quant_ref.py), written and read by the kernels given the type
GGML_TYPE = {torch.float32: GGMLQuantizationType.F32, torch.float16: GGMLQuantizationType.F16,
             torch.bfloat16: GGMLQuantizationType.BF16}
_FLOAT_OF = {t: d for d, t in GGML_TYPE.items()}


@dataclass
class SeqKV:
    """One sequence's block table: its blocks and how many tokens it holds; with sliding-window
    layers apart, their table (NULL_BLOCK where dropped) and the first position they still hold.
    Plain data: the model reads it, the serving room's `BlockManager` alone changes it."""
    blocks: list[int] = field(default_factory=list)
    n_tokens: int = 0
    swa_blocks: list[int] = field(default_factory=list)
    swa_start: int = 0
    # sliding-window layers: table entries below this one are no query's any more (the block manager may
    # release them when its pool needs room: llama.cpp's SWA cache keeps such cells until then)
    swa_lo: int = 0
    rs: int = -1  # hybrid models: this sequence's cell of the recurrent state (-1: none yet)
    # hybrid models: n -> (conv [Lr, K - 1, C], ssm [Lr, H, S, S]) host copies of the state after n tokens
    rs_ckpt: dict = field(default_factory=dict)
    # sliding-window models: c -> (first position, K list, V list: the SWA layers' rows [first, c) on
    # the host), the window held before the batch starting at c (a context checkpoint, resumed at c - 1)
    swa_ckpt: dict = field(default_factory=dict)


@dataclass(frozen=True)
class KeyRotation:
    """RoPE of the cached keys, to re-rotate them when they move (`KVStore.move`: --cache-reuse and
    the context shift, llama.cpp's K-shift): per-layer inverse frequencies (gemma3's local layers
    have their own base), the pair layout, per-layer ggml angle chains (`theta_scales`, as the
    model's own RoPE: 0 = angles from inv_freq) and the kernel backend that rotates (the model's;
    None: the device's default)."""
    inv_freqs: list[torch.Tensor]
    neox: bool
    theta_scales: tuple[float, ...] = ()
    ops: Any = None  # kernels.Backend
    # per layer: ggml's factor on cos and sin (YaRN's magnitude); llama.cpp's K-shift passes the
    # model's attn_factor to ggml_rope_ext again, so a moved key is scaled by it once more
    mscales: tuple[float, ...] = ()


@dataclass
class KVState:
    """K/V of a sequence's first n positions on the host, as the store keeps them: per layer one
    row of bytes per position (its KVH x D values in ggml type `type_k` / `type_v`; f16 by default),
    `k, v: [L, n, row_bytes] uint8`. `swa_start` (with an SWA pool): the sliding-window layers'
    rows below it are zeros (not held); None: the state vouches for the next token's window only
    (a slot file). What the RAM prompt cache keeps and a slot file holds."""
    k: torch.Tensor
    v: torch.Tensor
    type_k: GGMLQuantizationType
    type_v: GGMLQuantizationType
    swa_start: int | None = None
    # hybrid models: the recurrent state after the n tokens (conv [Lr, K - 1, C], ssm [Lr, H, S, S]
    # float32) and the context checkpoints at or below n (position -> (conv, ssm))
    rs: tuple[torch.Tensor, torch.Tensor] | None = None
    rs_ckpt: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        states = ([self.rs] if self.rs is not None else []) + list(self.rs_ckpt.values())
        return self.k.numel() + self.v.numel() + sum(t.numel() * t.element_size() for st in states for t in st)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on the CPU in an anonymous mapping whose pages the OS zero-fills on first
    touch, so the cache costs resident memory only for the blocks that have been written."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, max(n, 1)), dtype=torch.uint8)[:n].view(dtype).view(shape)


class KVStore:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float16, device: str | torch.device = "cpu",
                 windows: list[int] | None = None, num_swa_blocks: int = 0, rope: KeyRotation | None = None,
                 type_k: GGMLQuantizationType | None = None, type_v: GGMLQuantizationType | None = None,
                 attn_rot: bool = True, head_dims: list[int] | None = None):
        """`windows`: sliding window per layer (0: global); with `num_swa_blocks` > 0 the layers
        with a window live in the SWA pool of that many blocks (plus the null block). `rope`: what
        `move` re-rotates keys with. `type_k` / `type_v`: the K / V cache's ggml type (-ctk / -ctv;
        default: that of `dtype`); a quantized one is held as GGML blocks (uint8). `attn_rot`: False
        turns llama.cpp's Hadamard rotation of quantized caches off (LLAMA_ATTN_ROT_DISABLE).
        `head_dims`: each layer's own head size where they differ (gemma4: its rows are zero-padded
        to `head_dim`; each layer is rotated by the size of its own llama.cpp cache)."""
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.block_size, self.num_blocks, self.dtype = block_size, num_blocks, dtype
        self.device = torch.device(device)
        self.rope = rope
        ws = list(windows or []) if num_swa_blocks > 0 else []
        self.is_swa = [bool(ws[l]) if l < len(ws) else False for l in range(n_layers)]
        self.window = max(ws, default=0) if any(self.is_swa) else 0  # 0: no SWA pool
        self.num_swa_blocks = num_swa_blocks if self.window else 0
        assert len({w for w in ws if w}) <= 1, "one window for all local layers"
        self.type_k = GGMLQuantizationType(type_k) if type_k is not None else GGML_TYPE[dtype]
        self.type_v = GGMLQuantizationType(type_v) if type_v is not None else GGML_TYPE[dtype]
        for t in (self.type_k, self.type_v):
            if kernels.kv_quantized(t) and head_dim % 32:
                raise ValueError(f"{t.name} KV cache needs a head dimension divisible by 32 (it is {head_dim})")

        def tensors(t) -> list[torch.Tensor]:
            q = kernels.kv_quantized(t)
            last = kernels.kv_row_bytes(t, head_dim) if q else head_dim
            dt = torch.uint8 if q else _FLOAT_OF[t]
            return [_zeros((num_swa_blocks + 1 if sw else num_blocks, block_size, n_kv_heads, last), dt, self.device)
                    for sw in self.is_swa]
        self.k, self.v = tensors(self.type_k), tensors(self.type_v)
        # llama.cpp's Hadamard rotation of quantized caches (K with the query, V with the output): sizes, 0 none
        # per layer, as llama_kv_cache decides it for the cache holding the layer (gemma4: one for the
        # sliding layers, one for the others, each of one head size; both test layer 0's head size)
        dims = list(head_dims) if head_dims else [head_dim] * n_layers
        rots = [kernels.kv_rotation_sizes(self.type_k, self.type_v, d) if attn_rot and dims[0] % 64 == 0 else (0, 0)
                for d in dims]
        self.rot_k_layers, self.rot_v_layers = [r[0] for r in rots], [r[1] for r in rots]
        self.rot_k, self.rot_v = rots[0]  # (the same in every layer unless head_dims differ)
        self.rs = None  # hybrid models: the recurrent state's cells (`BlockManager.attach_recurrent`)
        self.recurrent_layers: list[bool] = []  # (their K/V tensors are never written)
        self.cell_ext = False  # M-RoPE models: slot files write llama.cpp's cell ext (x, y, token) per cell

    # ---- sizes -------------------------------------------------------------------------
    @property
    def kv_types(self) -> tuple[GGMLQuantizationType | None, GGMLQuantizationType | None]:
        """(k_type, v_type) as the kernels take them: a quantized cache's type, None for a float one."""
        return tuple(t if kernels.kv_quantized(t) else None for t in (self.type_k, self.type_v))

    def row_bytes(self, gtype: int) -> int | None:
        """Bytes of one position's K (or V) of one layer, all KV heads, in ggml type `gtype`; None
        for a type this store cannot take in."""
        if kernels.kv_quantized(gtype):
            return self.n_kv_heads * kernels.kv_row_bytes(gtype, self.head_dim)
        dt = _FLOAT_OF.get(gtype)
        return None if dt is None else self.n_kv_heads * self.head_dim * torch.empty((), dtype=dt).element_size()

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one position's K and V in every layer (what an export holds per token)."""
        return self.n_layers * (self.row_bytes(self.type_k) + self.row_bytes(self.type_v))

    @property
    def nbytes(self) -> int:
        """Bytes of all K/V tensors (both pools)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    # ---- addressing (from the table it is handed) -----------------------------------------
    def _slots(self, blocks: list[int], start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, flat slot = block * block_size + offset) of tokens [start, end) through a block table."""
        idx = torch.arange(start, end, dtype=torch.int64)
        blk = torch.tensor(blocks, dtype=torch.int64)[idx // self.block_size]
        return blk, blk * self.block_size + idx % self.block_size

    def slot_mapping(self, seq: SeqKV, start: int, end: int) -> torch.Tensor:
        """Flat slot index (block * block_size + offset) of tokens [start, end): [end - start] int64."""
        return self._slots(seq.blocks, start, end)[1]

    def swa_slot_mapping(self, seq: SeqKV, start: int, end: int, write: bool = True) -> torch.Tensor:
        """The same in the SWA pool: [end - start] int64; positions in dropped blocks map to -1
        (`write`: skipped by write_kv) or to the zero block (reads)."""
        blk, slots = self._slots(seq.swa_blocks, start, end)
        return torch.where(blk == NULL_BLOCK, -1, slots) if write else slots

    # ---- moving data between blocks --------------------------------------------------------
    def copy_block(self, src: int, dst: int, swa: bool = False) -> None:
        """Copy block src's K/V into block dst in every layer of the main pool (`swa`: of the SWA pool)."""
        for layer in range(self.n_layers):
            if self.is_swa[layer] == swa:
                self.k[layer][dst].copy_(self.k[layer][src])
                self.v[layer][dst].copy_(self.v[layer][src])

    def gather_slots(self, slots: torch.Tensor, swa_slots: torch.Tensor | None = None
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K and V at flat slots [n] per layer (SWA layers: at `swa_slots`): lists of [n, KVH, D]."""
        slots = slots.to(self.device)
        swa_slots = swa_slots.to(self.device) if swa_slots is not None else None
        heads = self.k[0].shape[2]
        at = [swa_slots if self.is_swa[l] else slots for l in range(self.n_layers)]
        ks = [self.k[l].view(-1, heads, self.k[l].shape[3])[at[l]].clone() for l in range(self.n_layers)]
        vs = [self.v[l].view(-1, heads, self.v[l].shape[3])[at[l]].clone() for l in range(self.n_layers)]
        return ks, vs

    def scatter_slots(self, slots: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
                      swa_slots: torch.Tensor | None = None) -> None:
        """Write per-layer K/V [n, KVH, D] at flat slots [n] (SWA layers: at `swa_slots`): float
        values (quantized into a quantized cache), or a quantized cache's own rows (uint8 [n, KVH,
        row_bytes], copied as they are)."""
        slots = slots.to(self.device)
        swa_slots = swa_slots.to(self.device) if swa_slots is not None else None
        kt, vt = self.kv_types
        for l in range(self.n_layers):
            at = swa_slots if self.is_swa[l] else slots
            k, v = ks[l], vs[l]
            raw_k, raw_v = kt is not None and k.dtype == torch.uint8, vt is not None and v.dtype == torch.uint8
            if not raw_k and not raw_v:
                kernels.write_kv(self._floats(k, self.k[l], kt), self._floats(v, self.v[l], vt), self.k[l], self.v[l], at,
                                 kt, vt)
                continue
            for x, cache, t, raw in ((k, self.k[l], kt, raw_k), (v, self.v[l], vt, raw_v)):
                if raw:
                    keep = at >= 0
                    cache.view(-1, *cache.shape[2:]).index_copy_(0, at[keep], x.to(self.device)[keep])
                else:
                    kernels.write_kv(self._floats(x, cache, t), self._floats(x, cache, t), cache, cache, at, t, t)

    def _floats(self, x: torch.Tensor, cache: torch.Tensor, t) -> torch.Tensor:
        """values on their way into `cache` (of type t; None: a float cache, in its dtype)"""
        return x.to(self.device, torch.float32 if t is not None else cache.dtype)

    def gather(self, seq: SeqKV, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of K and V of tokens [start, end) per layer: lists of [n, KVH, D] (SWA layers:
        zeros for dropped positions)."""
        swa = self.swa_slot_mapping(seq, start, end, write=False) if self.window else None
        return self.gather_slots(self.slot_mapping(seq, start, end), swa)

    def scatter(self, seq: SeqKV, start: int, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Write per-layer K/V [n, KVH, D] at token positions [start, start + n) (blocks reserved;
        SWA layers: positions in dropped blocks are skipped)."""
        end = start + ks[0].shape[0]
        swa = self.swa_slot_mapping(seq, start, end) if self.window else None
        self.scatter_slots(self.slot_mapping(seq, start, end), ks, vs, swa)

    def move(self, seq: SeqKV, src: int, dst: int, n: int) -> None:
        """Copy tokens [src, src + n) to [dst, dst + n) within `seq`'s blocks (dst < src), keys
        re-rotated by the position delta (dst - src) as llama.cpp's K-shift does (ggml_rope_ext on
        the cached keys: read in float32, rotated by the delta with the model's angles and its YaRN
        magnitude factor, stored back in the cache type). The rotation runs in the rotation's backend: the CPU kernels follow
        ggml's angle chain (`theta_scales`), Triton's `_rope_kernel` the plain angles (as ggml-cuda)."""
        ks, vs = self.gather(seq, src, src + n)
        kt = self.kv_types[0]
        if kt is not None:  # a quantized K: to float32, rotated, quantized again (llama.cpp's cast / rope / cpy)
            ks = [kernels.dequantize_kv(k, kt) for k in ks]
        rk = self.rot_k_layers
        if any(rk):  # the Hadamard rotation undone before RoPE, applied again after (build_rope_shift)
            ks = [kernels.hadamard(k, rk[l]) if rk[l] else k for l, k in enumerate(ks)]
        rot = self.rope
        ops = rot.ops if rot.ops is not None else kernels.Backend.for_device(self.device)
        delta = torch.full((n,), dst - src, dtype=torch.int64, device=self.device)
        ks = [ops.rope(k.float(), delta, f.to(self.device), rot.neox,
                       rot.theta_scales[l] if l < len(rot.theta_scales) else 0.0,
                       rot.mscales[l] if l < len(rot.mscales) else 1.0)
              for l, (k, f) in enumerate(zip(ks, rot.inv_freqs))]
        if any(rk):
            ks = [kernels.hadamard(k, rk[l]) if rk[l] else k for l, k in enumerate(ks)]
        self.scatter(seq, dst, ks, vs)

    def read_window(self, seq: SeqKV, first: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Host copies of the sliding-window layers' K/V at positions [first, n): lists (one per SWA
        layer) of [n - first, KVH, D]."""
        slots = self.swa_slot_mapping(seq, first, n, write=False).to(self.device)
        H = self.k[0].shape[2]
        swa_layers = [l for l in range(self.n_layers) if self.is_swa[l]]
        return ([self.k[l].view(-1, H, self.k[l].shape[3])[slots].cpu() for l in swa_layers],
                [self.v[l].view(-1, H, self.v[l].shape[3])[slots].cpu() for l in swa_layers])

    def write_window(self, seq: SeqKV, start: int, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Write the sliding-window layers' K/V (lists per SWA layer of [n, KVH, D]) at positions
        [start, start + n) through the table's `swa_blocks` (blocks allocated by the caller)."""
        slots = self.swa_slot_mapping(seq, start, start + ks[0].shape[0]).to(self.device)
        swa_layers = [l for l in range(self.n_layers) if self.is_swa[l]]
        for i, l in enumerate(swa_layers):  # the rows read_window read, in the cache's own types
            for x, cache in ((ks[i], self.k[l]), (vs[i], self.v[l])):
                keep = slots >= 0
                cache.view(-1, *cache.shape[2:]).index_copy_(0, slots[keep], x.to(self.device, cache.dtype)[keep])

    # ---- host rows -----------------------------------------------------------------------
    def read(self, seq: SeqKV, n: int) -> KVState:
        """The first n positions' K/V as host rows in the store's types (swa_start left None)."""
        ks, vs = self.gather(seq, 0, n)
        return KVState(self._rows(ks), self._rows(vs), self.type_k, self.type_v)

    def _rows(self, ts: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack(ts).cpu()  # [L, n, KVH, D]
        row = math.prod(x.shape[2:]) * x.element_size()  # bytes per position (n may be 0: an empty slot)
        return x.view(torch.uint8).reshape(x.shape[0], x.shape[1], row)

    def write(self, seq: SeqKV, state: KVState) -> None:
        """Write a state's rows at positions [0, n) (blocks reserved; rows of another float type are
        converted; SWA layers: positions in dropped blocks are skipped)."""
        self.scatter(seq, 0, self._values(state.k, state.type_k, self.type_k),
                     self._values(state.v, state.type_v, self.type_v))

    def _values(self, rows: torch.Tensor, gtype: int, own: int) -> list[torch.Tensor]:
        """A state's rows [L, n, row_bytes] of type gtype as what `scatter` takes into a cache of type
        `own`: the rows themselves where the types match and are quantized, else float values."""
        L, n = rows.shape[0], rows.shape[1]
        if kernels.kv_quantized(gtype):
            x = rows.contiguous().view(L, n, self.n_kv_heads, rows.shape[2] // self.n_kv_heads)
            return list((x if gtype == own else kernels.dequantize_kv(x, gtype)).unbind(0))
        return list(rows.contiguous().view(_FLOAT_OF[gtype]).view(L, n, self.n_kv_heads, self.head_dim).unbind(0))

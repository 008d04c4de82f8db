"""The sizes settled at start-up, as llama.cpp b1-0c1e570 settles them: the context (llama_context's
padding of n_ctx and of each sequence's share, llama-server's slot context), the KV pool's blocks, the
sliding-window pool (llama_kv_cache_iswa's cells) and their start-log lines. Pure functions of the
config and the model; `bootstrap.load` calls them."""
from __future__ import annotations

from typing import Callable

from runtime.model.decoder import Model
from runtime.model.kv_store import KVStore
from runtime.serving.blocks import swa_blocks_for, swa_pool_blocks
from runtime.serving.config import EngineConfig

Log = Callable[[str, str], None]  # (level letter, message)


N_CTX_PAD = 256  # llama_context pads n_ctx and n_ctx_seq to a multiple of this (GGML_PAD)


def _pad(n: int, to: int = N_CTX_PAD) -> int:
    return (n + to - 1) // to * to


def slot_layout(cfg: EngineConfig, n_ctx_train: int) -> tuple[int, int, bool, int]:
    """(n_ctx, n_slots, kv_unified, n_ctx_slot) as llama_context and llama-server b1-0c1e570 size
    them: n_ctx (-c; 0: the model's training context) rounded up to a multiple of 256; -np auto is 4
    slots sharing one unified cache of n_ctx tokens, otherwise each of the -np slots gets
    n_ctx / np rounded up to 256 (n_ctx_seq; n_ctx becomes np times that) unless -kvu; a slot's
    context is n_ctx_seq capped by --kv-unified-per-slot and by the training context (n_ctx_slot())."""
    n_ctx = _pad(cfg.n_ctx if cfg.n_ctx > 0 else n_ctx_train)
    if cfg.n_parallel is None or cfg.n_parallel < 0:
        n_slots, unified = 4, True
    else:
        n_slots, unified = max(1, cfg.n_parallel), bool(cfg.kv_unified)
    if unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = _pad(n_ctx // n_slots)
        if n_ctx_seq == 0:
            raise ValueError("n_ctx_seq == 0")
        n_ctx = n_ctx_seq * n_slots
    n_ctx_slot = n_ctx_seq
    if cfg.kv_unified_per_slot > 0:  # --kv-unified-per-slot N: no slot's context goes beyond N tokens
        n_ctx_slot = min(n_ctx_slot, cfg.kv_unified_per_slot)
    return n_ctx, n_slots, unified, min(n_ctx_slot, n_ctx_train) if n_ctx_train > 0 else n_ctx_slot


def log_context(cfg: EngineConfig, n_ctx_train: int, log: Log) -> None:
    """llama_context's and llama-server's lines about the sizes `slot_layout` settles: the rounding
    of n_ctx to the slots (a warning), n_ctx / n_ctx_seq (-lv 4), n_ctx_seq against the training
    context, --kv-unified-per-slot against n_ctx_seq, the slot context capped at the training context."""
    n_ctx, n_slots, unified, n_ctx_slot = slot_layout(cfg, n_ctx_train)
    given = _pad(cfg.n_ctx if cfg.n_ctx > 0 else n_ctx_train)
    n_ctx_seq = n_ctx if unified else n_ctx // n_slots
    if n_ctx != given:
        log("W", f"llama_context: n_ctx is not divisible by n_seq_max - rounding down to {n_ctx}")
    log("D", f"llama_context: n_seq_max             = {n_slots}")
    log("D", f"llama_context: n_ctx                 = {n_ctx}")
    log("D", f"llama_context: n_ctx_seq             = {n_ctx_seq}")
    if n_ctx_seq < n_ctx_train:
        log("D", f"llama_context: n_ctx_seq ({n_ctx_seq}) < n_ctx_train ({n_ctx_train}) -- the full capacity of "
                 "the model will not be utilized")
    elif n_ctx_seq > n_ctx_train:
        log("W", f"llama_context: n_ctx_seq ({n_ctx_seq}) > n_ctx_train ({n_ctx_train}) -- possible training "
                 "context overflow")
    per_slot = cfg.kv_unified_per_slot
    if per_slot > 0 and n_ctx_seq > per_slot:
        log("I", f"srv    load_model: capping per-slot context ({n_ctx_seq}) to --kv-unified-per-slot ({per_slot})")
    elif per_slot > n_ctx_seq:
        log("W", f"srv    load_model: --kv-unified-per-slot ({per_slot}) exceeds the per-slot pool capacity "
                 f"({n_ctx_seq}) - cap has no effect, slots are limited to {n_ctx_seq} (raise the KV pool with "
                 "-c, or unset -c to size it to n_parallel * kv_unified_per_slot)")
    capped = min(n_ctx_seq, per_slot) if per_slot > 0 else n_ctx_seq
    if capped > n_ctx_train:
        log("W", f"srv    load_model: the slot context ({capped}) exceeds the training context of the model "
                 f"({n_ctx_train}) - capping")


def n_blocks_for(cfg: EngineConfig, n_ctx_train: int) -> int:
    n_ctx, n_slots, _, _ = slot_layout(cfg, n_ctx_train)
    """Blocks of the main KV pool: n_ctx's positions, one partial block per slot more."""
    return (n_ctx + cfg.block_size - 1) // cfg.block_size + n_slots


def layer_head_dims(model: Model) -> list[int] | None:
    """Each layer's own head size where they differ (gemma4's sliding and full layers), else None."""
    dims = [L.head_dim or model.head_dim for L in model.layers]
    return dims if len(set(dims)) > 1 else None


def log_kv_size(store: KVStore, n_ctx: int, n_slots: int, unified: bool, log: Log) -> None:
    """llama_kv_cache's size line, as llama-server prints it at -lv 4: the cache's bytes at n_ctx cells,
    K and V apart, each in its type; its cells per stream (one stream per slot, or one with --kv-unified)
    and seqs / streams. (tritium's pool is sized in blocks for the same cells plus one per slot.)"""
    layers = store.n_layers - sum(store.recurrent_layers) if store.recurrent_layers else store.n_layers
    k = layers * n_ctx * store.row_bytes(store.type_k) / 2**20
    v = layers * n_ctx * store.row_bytes(store.type_v) / 2**20
    streams = 1 if unified else max(1, n_slots)
    log("D", f"llama_kv_cache: size = {k + v:7.2f} MiB ({n_ctx // streams:6d} cells, {layers:3d} layers, "
             f"{n_slots:2d}/{streams} seqs), K ({store.type_k.name.lower()}): {k:7.2f} MiB, "
             f"V ({store.type_v.name.lower()}): {v:7.2f} MiB")


def swa_layout(cfg: EngineConfig, model: Model, n_ctx_train: int, n_blocks: int, log: Log) -> tuple[list[int] | None, int, int]:
    """(windows per layer, SWA pool blocks, positions a sequence may keep below its window) for a
    model with sliding-window layers: a pool of at least llama.cpp's SWA cells (`blocks.swa_pool_blocks`),
    whose blocks below the windows are released only when it needs them, unless --swa-full or when
    that would not be smaller than the full cache (then they keep everything, as the main pool does)."""
    windows = [L.window for L in model.layers]
    if not any(windows):
        if cfg.swa_full:
            log("W", "srv    load_model: swa_full is not supported by this model, it will be disabled")
        return None, 0, 0
    if cfg.swa_full:
        return None, 0, 0
    n_ctx, n_slots, unified, _ = slot_layout(cfg, n_ctx_train)
    n_ctx_seq = n_ctx if unified else n_ctx // n_slots
    n_ubatch, W, BS = min(cfg.n_batch, cfg.n_ubatch), max(windows), cfg.block_size
    n_swa = swa_pool_blocks(W, n_slots, n_ubatch, n_ctx_seq, unified, BS)
    keep = max(BS, (n_swa - swa_blocks_for(W, n_slots, n_ubatch, BS)) * BS)
    return (windows, n_swa, keep) if n_swa < n_blocks else (None, 0, 0)

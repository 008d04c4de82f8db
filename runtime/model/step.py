"""A forward's inputs: the new tokens of each sequence (`SeqBatch`) and the host tensors one step
of `runtime.model.decoder.Model` reads (`StepTensors`, built by `build_step`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.model import media as mm
from runtime.model.kv_store import KVStore, SeqKV


@dataclass
class SeqBatch:
    """The new tokens of one sequence in a forward batch."""
    seq: SeqKV
    tokens: list[int]
    n_past: int  # tokens already in the cache; the first new token sits at this position
    logits: bool = True  # compute logits of the last new token
    n_logits: int = 1  # with logits: of the last n_logits new tokens (a speculative verify row: all of them)
    hidden: bool = False  # return the final normed hidden states of all new tokens (embeddings)
    # > 0: only the `topk` largest logits must be exact (the sampler keeps no more than those);
    # the others may come back as -inf. `banned` tokens are excluded from that top-k.
    topk: int = 0
    banned: tuple[int, ...] = ()
    lora: tuple[float, ...] = ()  # this sequence's scale per loaded LoRA adapter (runtime/model/lora.py)
    pos: list[int] | None = None  # each new token's rope position (None: its KV index, n_past + j)
    embd: tuple = ()  # `runtime.model.media.EmbdSpan`s: rows taking media embeddings (their tokens < 0)
    rs: int = -1  # hybrid models: the sequence's cell in the RecurrentStore (its state after n_past tokens)


@dataclass
class StepTensors:
    """A forward's inputs on the host: ids / pos / slots [T], tables [S, max_blocks] int32, cu
    [S + 1] int32, kv_lens [S] int32; `rows`: token rows whose logits are wanted."""
    ids: torch.Tensor
    pos: torch.Tensor
    slots: torch.Tensor
    tables: torch.Tensor
    cu: torch.Tensor
    kv_lens: torch.Tensor
    max_q_len: int
    rows: list[int]
    need_hidden: bool
    swa_slots: torch.Tensor | None = None  # [T]: the sliding-window layers' slots in the SWA pool
    swa_tables: torch.Tensor | None = None  # [S, max_blocks] int32: their block tables (kv_store.py)
    media: mm.StepMedia | None = None  # rows taking media embeddings (runtime/model/media.py)
    rs_cells: torch.Tensor | None = None  # [S] int64: each sequence's RecurrentStore cell (hybrid models)


def block_tables(tables: list[list[int]], min_width: int = 0) -> torch.Tensor:
    """Per-sequence block tables as one int32 [S, max(len, min_width)] tensor, zero-padded."""
    out = torch.zeros((len(tables), max(min_width, max(map(len, tables)))), dtype=torch.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return out


def build_step(kv: KVStore, batch: list[SeqBatch], mrope: bool) -> StepTensors:
    """The host tensors of a forward over `batch` (the rows' slots and block tables from `kv`);
    `mrope`: the model rotates by M-RoPE sections (media rows' 4 positions)."""
    ids, pos, slots, q_lens, kv_lens = [], [], [], [], []
    for b in batch:
        n = len(b.tokens)
        ids.extend(b.tokens)
        pos.append(torch.arange(b.n_past, b.n_past + n, dtype=torch.int64) if b.pos is None
                   else torch.tensor(b.pos, dtype=torch.int64))
        slots.append(kv.slot_mapping(b.seq, b.n_past, b.n_past + n))
        q_lens.append(n)
        kv_lens.append(b.n_past + n)
    tables = block_tables([b.seq.blocks for b in batch])
    swa_slots = swa_tables = None
    if kv.window:  # sliding-window layers in their own pool (runtime/model/kv_store.py)
        swa_slots = torch.cat([kv.swa_slot_mapping(b.seq, b.n_past, b.n_past + len(b.tokens)) for b in batch])
        swa_tables = block_tables([b.seq.swa_blocks for b in batch], tables.shape[1])
    cu = torch.zeros(len(batch) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    ends = cu[1:].tolist()
    pos_t = torch.cat(pos)
    return StepTensors(torch.tensor(ids, dtype=torch.int64).clamp_(min=0), pos_t, torch.cat(slots), tables, cu,
                       torch.tensor(kv_lens, dtype=torch.int32), max(q_lens),
                       rows=[r for b, e in zip(batch, ends) if b.logits for r in range(e - b.n_logits, e)],
                       need_hidden=any(b.hidden for b in batch), swa_slots=swa_slots, swa_tables=swa_tables,
                       media=mm.step_media(batch, pos_t, mrope))


def recurrent_cells(batch: list[SeqBatch], rs, arch: str) -> torch.Tensor:
    """[S] int64: each sequence's cell in the RecurrentStore `rs` (`SeqBatch.rs`, default `seq.rs`);
    the cells of sequences starting at 0 are cleared."""
    cells = [b.rs if b.rs >= 0 else b.seq.rs for b in batch]
    if rs is None or any(c < 0 or c >= rs.n_cells for c in cells):
        raise ValueError(f"{arch}: every sequence needs a recurrent state cell")
    for b, c in zip(batch, cells):
        if b.n_past == 0:
            rs.clear(c)
    return torch.tensor(cells, dtype=torch.int64)

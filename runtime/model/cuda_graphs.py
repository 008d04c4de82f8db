"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A decode step (every sequence feeds exactly one token) has a fixed shape once its batch is padded to
a bucket size B: token ids, positions and KV slots [B], block tables [B, max_blocks], KV lengths
[B]. Those inputs live in static device buffers; a step copies the host-side metadata into them and
replays the bucket's graph, so the ~15 kernel launches per layer (and their Python dispatch) cost
one graph launch. `Model.decode_logits` is the captured function: it never waits on the device.

Padding rows (B > number of sequences) feed token 0 at position 0 with KV slot -1 (the K/V write
skips them) and a KV length of 1 over block 0; every op is row-independent, so their logits, which
are dropped, cannot disturb the real rows.

`capture=False` runs the same static-buffer path eagerly, which is how the CPU tests check the
buffer handling, padding and bucket choice; `TRITIUM_CUDA_GRAPHS=0` makes the engine skip this
module altogether (eager `Model.forward` for every step; the engine reads it into
`EngineConfig.cuda_graphs` at start-up, `runtime/serving/bootstrap.py`).
"""
from __future__ import annotations

import torch

from runtime.model.kv_store import KVStore
from runtime.model.decoder import Model, SeqBatch

BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class DecodeGraphs:
    def __init__(self, model: Model, kv: KVStore, max_batch: int, max_blocks: int, capture: bool | None = None):
        dev = model.device
        self.model, self.kv = model, kv
        self.capture = dev.type == "cuda" if capture is None else capture
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        self.max_blocks = max_blocks
        B = max_batch
        # static device inputs (slices of these are what the graphs read)
        self.ids = torch.zeros(B, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(B, dtype=torch.int64, device=dev)
        self.slots = torch.full((B,), -1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros((B, max_blocks), dtype=torch.int32, device=dev)
        self.lens = torch.ones(B, dtype=torch.int32, device=dev)
        self.cu = torch.arange(B + 1, dtype=torch.int32, device=dev)
        # the sliding-window layers' slots and tables when the store keeps them apart (kv_store.py)
        self.swa = bool(kv.window)
        self.swa_slots = torch.full((B,), -1, dtype=torch.int64, device=dev) if self.swa else None
        self.swa_tables = torch.zeros((B, max_blocks), dtype=torch.int32, device=dev) if self.swa else None
        # host staging: ids, pos, slots, lens in one int64 row block, tables apart
        pin = dev.type == "cuda"
        self._h_meta = torch.zeros((4, B), dtype=torch.int64, pin_memory=pin)
        self._h_tables = torch.zeros((B, max_blocks), dtype=torch.int32, pin_memory=pin)
        self._h_swa = torch.zeros((B, max_blocks + 1), dtype=torch.int32, pin_memory=pin) if self.swa else None
        self._graphs: dict[int, tuple[object, torch.Tensor]] = {}  # bucket -> (CUDAGraph, logits [B, V])
        self._pool = None
        self._copied = torch.cuda.Event() if pin else None

    def supports(self, batch: list[SeqBatch]) -> bool:
        """A decode-only batch that fits the buffers: one token and logits per sequence."""
        return 0 < len(batch) <= self.buckets[-1] and all(
            len(b.tokens) == 1 and b.logits and not b.hidden and len(b.seq.blocks) <= self.max_blocks
            and len(b.seq.swa_blocks) <= self.max_blocks for b in batch)

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    @torch.inference_mode()
    def run(self, batch: list[SeqBatch]) -> torch.Tensor:
        """Logits [len(batch), V] float32 on the model's device (full rows: no top-k shortcut).
        Blocks must be reserved beforehand; n_tokens of the sequences is not touched, as in
        `Model.forward` (the caller advances it)."""
        n = len(batch)
        B = self.bucket(n)
        meta, tables = self._h_meta, self._h_tables
        if self._copied is not None:
            self._copied.synchronize()
        meta[0, :B] = 0
        meta[1, :B] = 0
        meta[2, :B] = -1
        meta[3, :B] = 1
        tables[:B] = 0
        for i, b in enumerate(batch):
            meta[0, i] = b.tokens[0]
            meta[1, i] = b.n_past if b.pos is None else b.pos[0]
            meta[2, i] = self.kv.slot_mapping(b.seq, b.n_past, b.n_past + 1)[0]
            meta[3, i] = b.n_past + 1
            tables[i, : len(b.seq.blocks)] = torch.tensor(b.seq.blocks, dtype=torch.int32)
        if self.swa:  # column 0: the slot (< 2^31 rows), then the table
            swa = self._h_swa
            swa[:B, 0] = -1
            swa[:B, 1:] = 0
            for i, b in enumerate(batch):
                swa[i, 0] = self.kv.swa_slot_mapping(b.seq, b.n_past, b.n_past + 1)[0]
                swa[i, 1: 1 + len(b.seq.swa_blocks)] = torch.tensor(b.seq.swa_blocks, dtype=torch.int32)
        nb = meta.is_pinned()  # asynchronous copies from pinned memory on CUDA
        self.ids[:B].copy_(meta[0, :B], non_blocking=nb)
        self.pos[:B].copy_(meta[1, :B], non_blocking=nb)
        self.slots[:B].copy_(meta[2, :B], non_blocking=nb)
        self.lens[:B].copy_(meta[3, :B], non_blocking=nb)
        self.tables[:B].copy_(tables[:B], non_blocking=nb)
        if self.swa:
            self.swa_slots[:B].copy_(self._h_swa[:B, 0], non_blocking=nb)
            self.swa_tables[:B].copy_(self._h_swa[:B, 1:], non_blocking=nb)
        if nb:  # the staging buffers are rewritten next step: the copies must have read them by then
            self._copied.record()
        if self.capture:
            if B not in self._graphs:
                self._graphs[B] = self._capture(B)
            graph, logits = self._graphs[B]
            graph.replay()
        else:
            logits = self._step(B)
        return logits[:n]

    def _step(self, B: int) -> torch.Tensor:
        swa = (self.swa_slots[:B], self.swa_tables[:B]) if self.swa else (None, None)
        return self.model.decode_logits(self.kv, self.ids[:B], self.pos[:B], self.slots[:B], self.tables[:B],
                                        self.cu[:B + 1], self.lens[:B], *swa)

    def _capture(self, B: int) -> tuple[object, torch.Tensor]:
        """Warm up on a side stream (Triton autotuning and lazy initialisation must not happen
        inside a capture), then capture. The warm-up writes the same K/V the replay writes."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(B)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(B)
        return graph, logits

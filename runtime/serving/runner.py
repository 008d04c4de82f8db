"""The model runner: runs a step's batch through the model and records what the cache now holds.

`run` takes a `StepPlan` (it reads only `plan.batch`), replays decode-only batches from CUDA
graphs when they are set up (`runtime.model.cuda_graphs`) and runs everything else through
`Model.forward`, in micro-batches of at most `n_ubatch` rows (llama.cpp's `-ub`: a step of four
430-token prompts is four forwards of <= 512 rows, so its activations stay those of 512 rows). The
model and the graphs only compute, into the blocks the scheduler reserved; this is the one place
where a sequence's `n_tokens` advances after a forward (`BlockManager.commit`) and where the
sliding-window layers' blocks move along (`BlockManager.advance_window`, per micro-batch).

`pool_embeddings` turns the hidden states of an embedding task's prompt into its vectors.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from runtime.model.cuda_graphs import DecodeGraphs
from runtime.model.decoder import Model, SeqBatch
from runtime.model.media import slice_spans
from runtime.serving.blocks import BlockManager
from runtime.serving.plan import StepPlan


@dataclass
class StepOutput:
    logits: torch.Tensor | None  # [rows with logits, n_vocab] float32, in batch order
    hidden: list[torch.Tensor | None]  # per row: [n_new, C] final normed hidden states, or None


class ModelRunner:
    def __init__(self, model: Model, blocks: BlockManager, graphs: DecodeGraphs | None = None, n_ubatch: int = 512):
        self.model, self.blocks, self.graphs, self.n_ubatch = model, blocks, graphs, max(1, n_ubatch)
        self.store = blocks.store  # the K/V tensors the forwards read and write

    def run(self, plan: StepPlan, graphs: bool = True) -> StepOutput:
        """One forward over `plan.batch`; `graphs=False` forces the eager path."""
        batch = plan.batch
        lora = any(b.lora for b in batch)  # LoRA rows run eagerly (the graphs hold the base model only)
        if graphs and self.graphs is not None and self.graphs.supports(batch) and not lora:
            self._advance_windows(batch)
            out = StepOutput(self.graphs.run(batch), [None] * len(batch))
        elif sum(len(b.tokens) for b in batch) <= self.n_ubatch:
            self._advance_windows(batch)
            out = StepOutput(*self.model.forward(self.store, batch))
        else:
            out = self._run_ubatches(batch)
        for b in batch:
            self.blocks.commit(b.seq, b.n_past + len(b.tokens))
        return out

    def _advance_windows(self, batch: list[SeqBatch]) -> None:
        """Sliding-window layers with a pool of their own (runtime/serving/blocks.py): drop what left the
        window of each row's first new token, make room for its rows (per micro-batch, so that a
        long prompt never holds more than its window plus n_ubatch rows there)."""
        for b in batch:
            self.blocks.advance_window(b.seq, b.n_past, b.n_past + len(b.tokens))

    def _run_ubatches(self, batch: list[SeqBatch]) -> StepOutput:
        """The batch as forwards of <= n_ubatch rows, in order (a row's pieces see the KV of the
        pieces before them); logits and hidden states put back together per row."""
        pieces: list[tuple[int, SeqBatch]] = []  # (row index, piece)
        for i, b in enumerate(batch):
            for a in range(0, len(b.tokens), self.n_ubatch):
                last = a + self.n_ubatch >= len(b.tokens)
                e = a + self.n_ubatch
                pieces.append((i, dataclasses.replace(
                    b, tokens=b.tokens[a:e], n_past=b.n_past + a, logits=b.logits and last,
                    topk=b.topk if last else 0, banned=b.banned if last else (),
                    pos=None if b.pos is None else b.pos[a:e], embd=slice_spans(b.embd, a, e))))
        logits: list[torch.Tensor] = []
        hidden: list[list[torch.Tensor]] = [[] for _ in batch]
        start = 0
        while start < len(pieces):
            end, n = start, 0
            while end < len(pieces) and n + len(pieces[end][1].tokens) <= self.n_ubatch:
                n += len(pieces[end][1].tokens)
                end += 1
            self._advance_windows([p for _, p in pieces[start:end]])  # moved with the earlier pieces
            lg, hid = self.model.forward(self.store, [p for _, p in pieces[start:end]])
            if lg is not None:
                logits.append(lg)
            for (i, _), h in zip(pieces[start:end], hid):
                if h is not None:
                    hidden[i].append(h)
            start = end
        return StepOutput(torch.cat(logits) if logits else None,
                          [torch.cat(h) if h else None for h in hidden])


def pool_embeddings(hid: torch.Tensor, pooling: str, normalize: int, rank_head=None) -> list[list[float]]:
    """hid: [n_tokens, C] -> list of vectors (one per token for pooling 'none'); 'rank': the last
    token (a causal model's) through `rank_head` (`Model.rank_scores`), the score first, not normalized."""
    if pooling == "none":  # one raw vector per token: b1 normalizes only pooled embeddings
        return hid.double().tolist()
    if pooling == "rank":
        return rank_head(hid[-1:]).double().tolist()
    if pooling == "cls":
        vecs = hid[:1]
    elif pooling == "last":
        vecs = hid[-1:]
    else:
        vecs = hid.mean(0, keepdim=True)
    vecs = vecs.double()
    if normalize == 0:
        vecs = vecs / vecs.abs().amax(1, keepdim=True).clamp_min(1e-30) * 32760.0
    elif normalize == 1:
        vecs = vecs / vecs.abs().sum(1, keepdim=True).clamp_min(1e-30)
    elif normalize == 2:
        vecs = vecs / vecs.norm(dim=1, keepdim=True).clamp_min(1e-30)
    elif normalize > 2:
        vecs = vecs / vecs.abs().pow(normalize).sum(1, keepdim=True).pow(1.0 / normalize).clamp_min(1e-30)
    return vecs.tolist()

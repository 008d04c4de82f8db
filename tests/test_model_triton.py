"""The engine's forward through the Triton kernels (interpreter on the CPU, native on a GPU with
TRITIUM_KERNEL_DEVICE=cuda) gives the same logits and greedy tokens as through the torch reference
ops, and as through the CPU backend the CPU engine uses (each forced with `Model(backend=...)`)."""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import random

import pytest
import torch

from runtime.cuda_graphs import DecodeGraphs
from runtime.kv_cache import SeqKV
from runtime.loader import load_model
from runtime.model import Model, SeqBatch
from runtime.tiny_model import spec_with, write_tiny_model

DEVICE = os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu")


def _run(lm, backend: str, seqs: list[list[int]], n_decode: int, graphs: bool = False):
    """Prefill `seqs` together, then n_decode greedy steps (through `DecodeGraphs` when `graphs`:
    captured CUDA graphs on a GPU, the same static buffers run eagerly on the CPU). The CPU backend
    runs with its quantized weights dequantized (float math like Triton's; its integer-dot path
    quantizes the activations and is checked against the float reference in test_model.py)."""
    model = Model(lm, DEVICE, backend=backend, pack_quantized=False if backend == "cpu" else None)
    kv = model.new_cache(256, block_size=16, dtype=torch.float32)
    states = [SeqKV() for _ in seqs]
    batch = []
    for s, toks in zip(states, seqs):
        kv.reserve(s, len(toks))
        batch.append(SeqBatch(s, toks, 0))
    logits, _ = model.forward(kv, batch)
    for s, toks in zip(states, seqs):
        s.n_tokens = len(toks)  # the caller advances the sequences after a forward
    runner = DecodeGraphs(model, kv, max_batch=4, max_blocks=4, capture=DEVICE == "cuda") if graphs else None
    all_logits = [logits.float().cpu()]
    tokens = [logits.argmax(-1).tolist()]
    for _ in range(n_decode):
        batch = []
        for s, t in zip(states, tokens[-1]):
            kv.reserve(s, s.n_tokens + 1)
            batch.append(SeqBatch(s, [t], s.n_tokens))
        if runner is not None:
            assert runner.supports(batch)
            logits = runner.run(batch)
        else:
            logits, _ = model.forward(kv, batch)
        for s in states:
            s.n_tokens += 1
        all_logits.append(logits.float().cpu())
        tokens.append(logits.argmax(-1).tolist())
    return torch.stack(all_logits), tokens


@pytest.mark.parametrize("arch,wtype", [("llama", "q8_0"), ("qwen2", "f16")])
def test_triton_path_matches_reference_path(tmp_path, arch, wtype):
    spec = spec_with(arch=arch, wtype=wtype, n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=128,
                     init_std=0.2, seed=random.randrange(1 << 20))
    path = tmp_path / "m.gguf"
    write_tiny_model(path, spec)
    lm = load_model(path)
    rng = random.Random(spec.seed)
    seqs = [[rng.randrange(128) for _ in range(n)] for n in (9, 3)]
    tl_logits, tl_tokens = _run(lm, "triton", seqs, 3)
    import sys
    assert "kernels.triton" in sys.modules  # the Triton kernels really ran
    for reference in ("torch", "cpu"):
        ref_logits, ref_tokens = _run(lm, reference, seqs, 3)
        rel = float((tl_logits - ref_logits).norm() / ref_logits.norm())
        assert rel < 2e-3, (reference, rel)
        assert tl_tokens == ref_tokens, reference


def test_decode_graphs_through_triton_match_reference_path(tmp_path):
    """Decode steps from the static buffers of `runtime.cuda_graphs` (3 sequences padded to a
    bucket of 4; real graph capture and replay when TRITIUM_KERNEL_DEVICE=cuda)."""
    spec = spec_with(arch="qwen2", wtype="q4_k", n_layer=1, n_embd=256, n_head=4, n_head_kv=2, n_ff=256,
                     n_vocab=128, init_std=0.2, seed=random.randrange(1 << 20))
    path = tmp_path / "m.gguf"
    write_tiny_model(path, spec)
    lm = load_model(path)
    rng = random.Random(spec.seed)
    seqs = [[rng.randrange(128) for _ in range(n)] for n in (9, 3, 17)]
    ref_logits, ref_tokens = _run(lm, "torch", seqs, 3)
    tl_logits, tl_tokens = _run(lm, "triton", seqs, 3, graphs=True)
    rel = float((tl_logits - ref_logits).norm() / ref_logits.norm())
    assert rel < 2e-3, rel
    assert tl_tokens == ref_tokens

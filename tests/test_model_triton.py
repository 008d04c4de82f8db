"""The engine's forward through the Triton kernels (interpreter on the CPU, native on a GPU with
TRITIUM_KERNEL_DEVICE=cuda) against the torch reference ops and the CPU backend, each forced with
`Model(backend=...)`, computed the same way: same device, same activation dtype
(`Model.act_dtype`: float32 on the CPU, bfloat16 on CUDA), same KV cache dtype, same tokens fed
(the reference's greedy tokens, teacher-forced into every path, so that one near-tie cannot
send the paths down different continuations).

Tolerances follow the precision: the Triton path's decode matmuls (up to 8 rows) quantize their
activations to 8 bits per 32 (q8_1, llama.cpp's CUDA dot products: kernels/triton/qmatmul_q8.py),
and bfloat16 rounds every op's output to 8 bits of mantissa, in another order per path, so the
logits agree to ~3e-2 (relative, over all logits) and greedy tokens are measured over many
prompts: every position whose reference margin (top-1 minus top-2) exceeds twice the observed
logit error must agree, and at least 90% of those whose margin exceeds 4 x the rms logit error
(the output head reads at most 8 rows here: quantized activations at every step, and the tiny
random models have near-ties that 8-bit activations may flip)."""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import random
import sys

import pytest
import torch

from runtime.model.cuda_graphs import DecodeGraphs
from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.model.tiny_model import spec_with, write_tiny_model

DEVICE = os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("TRITIUM_KERNEL_DEVICE=cuda without a GPU", allow_module_level=True)
KV_DTYPE = torch.float32 if DEVICE == "cpu" else torch.float16
N_PROMPTS = 8
N_DECODE = 3


def _run(lm, backend: str, seqs: list[list[int]], forced: list[list[int]] | None, graphs: bool = False,
         act: torch.dtype | None = None):
    """Prefill `seqs` together, then N_DECODE steps feeding `forced[step]` (one token per
    sequence) or, without it, this path's own greedy tokens (through `DecodeGraphs` when `graphs`:
    captured CUDA graphs on a GPU, the same static buffers run eagerly on the CPU). Returns
    (logits [steps + 1, S, V] float32 on the CPU, greedy tokens per step, the model)."""
    # the CPU backend with its quantized weights dequantized (float math like Triton's; its integer-dot
    # path quantizes the activations and is checked against the float reference in test_model.py)
    model = Model(lm, DEVICE, backend=backend, act_dtype=act, pack_quantized=False if backend == "cpu" else None)
    kv = BlockManager(model.new_kv_store(1024, block_size=16, dtype=KV_DTYPE))
    states = [SeqKV() for _ in seqs]
    batch = []
    for s, toks in zip(states, seqs):
        kv.reserve(s, len(toks))
        batch.append(SeqBatch(s, toks, 0))
    logits, _ = model.forward(kv.store, batch)
    for s, toks in zip(states, seqs):
        s.n_tokens = len(toks)  # the caller advances the sequences after a forward
    runner = DecodeGraphs(model, kv.store, max_batch=8, max_blocks=8, capture=DEVICE == "cuda") if graphs else None
    all_logits = [logits.float().cpu()]
    tokens = [logits.argmax(-1).tolist()]
    for step in range(N_DECODE):
        feed = forced[step] if forced is not None else tokens[-1]
        batch = []
        for s, t in zip(states, feed):
            kv.reserve(s, s.n_tokens + 1)
            batch.append(SeqBatch(s, [t], s.n_tokens))
        if runner is not None:
            assert runner.supports(batch)
            logits = runner.run(batch)
        else:
            logits, _ = model.forward(kv.store, batch)
        for s in states:
            s.n_tokens += 1
        all_logits.append(logits.float().cpu())
        tokens.append(logits.argmax(-1).tolist())
    return torch.stack(all_logits), tokens, model


def _compare(got: torch.Tensor, want: torch.Tensor, act_dtype: torch.dtype, what: str):
    """Logits within the tolerance (module docstring); greedy agreement where the margin is clear,
    and over 90% of the positions outside the typical noise."""
    rel = float((got - want).norm() / want.norm())
    assert rel < 3e-2, (what, rel)
    err = float((got - want).abs().max())
    top2 = want.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    agree = got.argmax(-1) == want.argmax(-1)
    clear = margin > 2 * err
    assert bool(agree[clear].all()), (what, "a clear greedy token differs", err)
    # and 90% of the positions whose margin is outside the typical noise (4 x the rms logit error):
    # a tiny random model has near-ties that 8-bit activations may flip, a wrong kernel flips many more
    typical = margin > 4 * float((got - want).pow(2).mean().sqrt())
    assert typical.any() and float(agree[typical].float().mean()) >= 0.9, (what, float(agree[typical].float().mean()),
                                                         int(typical.sum()))
    return rel


def _model(tmp_path, **kw):
    kw = {**dict(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=128, init_std=0.2), **kw}
    spec = spec_with(seed=random.randrange(1 << 20), **kw)
    path = tmp_path / "m.gguf"
    write_tiny_model(path, spec)
    return load_model(path), random.Random(spec.seed)


@pytest.mark.parametrize("arch,wtype", [("llama", "q8_0"), ("qwen2", "f16")])
def test_triton_path_matches_reference_path(tmp_path, arch, wtype):
    lm, rng = _model(tmp_path, arch=arch, wtype=wtype)
    seqs = [[rng.randrange(128) for _ in range(rng.randrange(2, 20))] for _ in range(N_PROMPTS)]
    ref_logits, ref_tokens, ref_model = _run(lm, "torch", seqs, None)
    forced = ref_tokens[:N_DECODE]
    tl_logits, _, tl_model = _run(lm, "triton", seqs, forced)
    assert "kernels.triton" in sys.modules  # the Triton kernels really ran
    assert tl_model.act_dtype == ref_model.act_dtype == (torch.float32 if DEVICE == "cpu" else torch.bfloat16)
    _compare(tl_logits, ref_logits, tl_model.act_dtype, "torch")
    if DEVICE == "cpu":  # the CPU engine's backend, float32 like the others here
        cpu_logits, _, _ = _run(lm, "cpu", seqs, forced)
        _compare(tl_logits, cpu_logits, torch.float32, "cpu")


def test_decode_graphs_through_triton_match_reference_path(tmp_path):
    """Decode steps from the static buffers of `runtime.model.cuda_graphs` (5 sequences padded to a
    bucket of 8; real graph capture and replay when TRITIUM_KERNEL_DEVICE=cuda)."""
    lm, rng = _model(tmp_path, arch="qwen2", wtype="q4_k", n_embd=256, n_ff=256)
    seqs = [[rng.randrange(128) for _ in range(rng.randrange(2, 20))] for _ in range(5)]
    ref_logits, ref_tokens, _ = _run(lm, "torch", seqs, None)
    tl_logits, _, tl_model = _run(lm, "triton", seqs, ref_tokens[:N_DECODE], graphs=True)
    _compare(tl_logits, ref_logits, tl_model.act_dtype, "torch")


def test_bf16_activations_match_reference_computed_the_same_way(tmp_path):
    """bfloat16 activations (the CUDA default) forced on this device too: the Triton path and the
    torch reference both in bfloat16, compared at bfloat16's tolerance; the logits stay float32
    (the output head runs in float32)."""
    lm, rng = _model(tmp_path, arch="qwen2", wtype="q8_0")
    seqs = [[rng.randrange(128) for _ in range(rng.randrange(2, 20))] for _ in range(N_PROMPTS)]
    ref_logits, ref_tokens, ref_model = _run(lm, "torch", seqs, None, act=torch.bfloat16)
    tl_logits, _, tl_model = _run(lm, "triton", seqs, ref_tokens[:N_DECODE], act=torch.bfloat16)
    assert tl_model.act_dtype == ref_model.act_dtype == torch.bfloat16
    assert tl_model.layers[0].bqkv.dtype == torch.bfloat16  # no float32 promotion at the bias
    assert tl_logits.dtype == torch.float32
    rel = _compare(tl_logits, ref_logits, torch.bfloat16, "torch bf16")
    f32_logits, _, _ = _run(lm, "torch", seqs, ref_tokens[:N_DECODE])
    # bfloat16 costs precision against float32, within the bound the comparison allows
    assert float((ref_logits - f32_logits).norm() / f32_logits.norm()) < 3e-2
    assert rel < 3e-2

"""The whole engine on the Triton path before any GPU: the real `Engine` (scheduler, runner with the
decode buffers of `runtime.model.cuda_graphs` run without capture, sampler, grammar mask) with the
Triton kernel backend on CPU tensors under TRITON_INTERPRET=1 (`EngineConfig.kernel_backend`), on a
small generated model whose matrices are repacked for the GPU (Q8_0 and Q4_0: the dp4a decode GEMV
and the tensor-core prompt matmul), against the same engine on the torch reference ops. Greedy
tokens must be equal. The decode matmuls' 8-bit activations move the logits by ~1% (~0.1 here),
so the model (its seed) and prompts are ones whose reference top-1 margins are all above 0.5
(checked below): where a margin is that clear, only a wrong kernel changes the token."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import sys

import pytest

from runtime.model.tiny_model import spec_with, write_tiny_model
from runtime.serving import Engine, EngineConfig
from runtime.tasks import CompletionResult, CompletionTask, SamplingParams

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("the Triton kernels on CPU tensors need TRITON_INTERPRET=1 before triton is imported",
                allow_module_level=True)

N_PREDICT = 5


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine-triton") / "tiny-q8.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, wtype="q8_0",
                                     init_std=1.0, seed=4), vocab="builtin")
    return str(path)


def _engine(model_path: str, backend: str) -> Engine:
    e = Engine(EngineConfig(model_path=model_path, kernel_backend=backend, n_parallel=2, n_ctx=512,
                            cuda_graphs="eager", cache_ram_mib=0, warmup=False, verbosity=0))
    e.load()
    e.start()
    return e


def _generate(e: Engine, prompts: list[tuple[str, str]]) -> list[CompletionResult]:
    """Greedy completions of (prompt, grammar) pairs, submitted together (one continuous batch)."""
    handles = []
    for p, grammar in prompts:
        ids = e.tokenizer.encode(p, add_special=True, parse_special=True)
        params = SamplingParams(temperature=0.0, grammar=grammar, n_probs=2)
        handles.append(e.submit(CompletionTask(ids, params, n_predict=N_PREDICT)))
    out = []
    for h in handles:
        r = h.result_sync(timeout=900)
        assert isinstance(r, CompletionResult), r
        out.append(r)
    return out


def test_engine_on_triton_kernels_matches_the_reference(model_path):
    prompts = [("The quick brown fox", ""), ("def main():\n    return", ""), ("The quick brown fox", "root ::= [a-z ]+")]
    ref = _engine(model_path, "torch")
    try:
        want = _generate(ref, prompts)
    finally:
        ref.stop()
    tl = _engine(model_path, "triton")
    try:
        assert tl.runner.model.ops.name == "triton" and "kernels.triton" in sys.modules
        assert tl.runner.graphs is not None  # decode steps from the static buffers
        assert any(w.layout == "gpu" for L in tl.runner.model.layers for w in L.wqkv)  # repacked weights
        got = _generate(tl, prompts)
    finally:
        tl.stop()
    for w, g in zip(want, got):
        assert g.tokens == w.tokens, (w.content, g.content)
        assert len(w.tokens) == N_PREDICT
    assert got[2].content and set(got[2].content) <= set("abcdefghijklmnopqrstuvwxyz "), got[2].content
    assert got[2].tokens != got[0].tokens  # the grammar changed what the same prompt samples
    # the reference's top-1 margins (log-probability) are clear at every step
    for w in want:
        for t in w.probs:
            lp = sorted((p.logprob for p in t.probs), reverse=True)
            assert len(lp) < 2 or lp[0] - lp[1] > 0.5, lp

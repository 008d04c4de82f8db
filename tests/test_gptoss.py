"""gpt-oss (runtime/model/arch/gptoss.py: attention sinks and biases, alternating sliding windows, biased
experts with swiglu_oai and the softmax after the top k; MXFP4 experts) on the tiny random models of
scripts/record_gptoss_reference.py:

- attention sinks in every backend's paged attention (reference, CPU fattn.c, Triton decode with and
  without split-K and prefill under the interpreter) against a float64 softmax with the sink logit;
- swiglu_oai and the routing softmax (CPU C, glibc expf as ggml's ops) against float64;
- greedy tokens equal to llama-server b1-0c1e570's (tests/data/gptoss_greedy.json, recorded by
  `python scripts/record_gptoss_reference.py` with an AVX2 build on an AVX2-only EPYC; measured
  2026-12-07: 8/8 on both variants (experts MXFP4 + Q8_0 + F32 router; all F32) in both
  configurations (defaults; `-ctk f32 -ctv f32 -fa off`); the logits of the MXFP4 variant equal
  libllama's bit for bit over 15 decode steps, scripts/llama_logits_ref.c); the sinks and the expert
  biases each matter (fewer prompts agree without them). With YaRN as the released models have it
  ("yarn-mxfp4"): 8/8 with the default float16 cache too, since YaRN's magnitude factor is applied
  inside the rope as ggml_rope_ext does (cos and sin times runtime.model.rope.rope_mscale), so the
  cached keys are rounded to float16 with the factor in them (with the factor on the attention scale
  instead, as before: 1/8);
- the model through the Triton backend (interpreter) against the reference backend;
- the server serving it; `-tp` refused with a clear message.
"""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

import kernels
from kernels.cpu import mxfp4 as cpu_mxfp4, native
from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.decoder import Model, SeqBatch
from runtime.model.loader import load_model
from runtime.tokenizer import load_tokenizer
from tests.llama_tokens import compare, greedy, recorded_tokens, variant_files

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "scripts/record_gptoss_reference.py"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return recorded_tokens("gptoss_greedy.json")


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return variant_files("record_gptoss_reference", tmp_path_factory.mktemp("gptoss"))


# ---------------------------------------------------------------------------------------------
# kernels

H, KVH, D, BS, NB = 4, 2, 32, 16, 12
SINKS = torch.tensor([0.5, 3.0, -2.0, 8.0])


def _dense(q, positions, kc, vc, table, L, window=0):
    """float64 attention of q [n, H, D] at `positions` over the first L cached keys, with the sinks."""
    k = kc[table.long()].reshape(-1, KVH, D)[:L].double()
    v = vc[table.long()].reshape(-1, KVH, D)[:L].double()
    out = torch.empty(len(positions), H, D, dtype=torch.float64)
    for j, p in enumerate(positions):
        for h in range(H):
            s = (k[:, h // (H // KVH)] @ q[j, h].double()) * 0.2
            seen = torch.arange(L) <= p
            if window:
                seen &= torch.arange(L) > p - window
            s = torch.cat([s.masked_fill(~seen, float("-inf")), SINKS[h:h + 1].double()])
            out[j, h] = torch.softmax(s, 0)[:L] @ v[:, h // (H // KVH)]
    return out


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_attention_sinks(backend, dtype):
    g = torch.Generator().manual_seed(1)
    kc, vc = torch.randn(NB, BS, KVH, D, generator=g).to(dtype), torch.randn(NB, BS, KVH, D, generator=g).to(dtype)
    bt = torch.randperm(NB, generator=g).reshape(2, 6).int()
    lens = torch.tensor([40, 70], dtype=torch.int32)
    q = torch.randn(8, H, D, generator=g)
    ops = kernels.Backend(backend)
    # float16 caches: fattn.c's float16 accumulator (llama.cpp's), Triton's float16 q and P
    tol = 1e-5 if dtype == torch.float32 and backend != "triton" else 3e-3
    for window in (0, 16):  # a prompt chunk of 7 rows beside a decode row; then decode rows only
        want = torch.cat([_dense(q[:7], range(33, 40), kc, vc, bt[0], 40, window),
                          _dense(q[7:], [69], kc, vc, bt[1], 70, window)])
        got = ops.paged_attention(q, kc, vc, bt, torch.tensor([0, 7, 8], dtype=torch.int32), lens, 0.2, 0.0, None,
                                  window, sinks=SINKS)
        assert (got.double() - want).abs().max() < tol, (window, (got.double() - want).abs().max())
    want = torch.cat([_dense(q[:1], [39], kc, vc, bt[0], 40), _dense(q[1:2], [69], kc, vc, bt[1], 70)])
    got = ops.paged_attention(q[:2], kc, vc, bt, torch.tensor([0, 1, 2], dtype=torch.int32), lens, 0.2, 0.0, 1, 0,
                              sinks=SINKS)
    assert (got.double() - want).abs().max() < tol
    if backend == "triton":  # split-K: the sink enters the merge of the partial softmaxes
        from kernels.triton.paged_decode import paged_decode

        got = paged_decode(q[:2], kc, vc, bt, torch.tensor([0, 1, 2], dtype=torch.int32), lens, 0.2, num_splits=4,
                           sinks=SINKS)
        assert (got.double() - want).abs().max() < tol


@pytest.mark.skipif(native.lib() is None, reason="no C compiler")
def test_swiglu_oai_and_routing_softmax():
    g = torch.linspace(-12, 12, 97)
    u = torch.linspace(9, -9, 97)
    x, y = g.double().clamp(max=7.0), u.double().clamp(-7.0, 7.0)
    want = x / (1 + torch.exp(-1.702 * x)) * (y + 1)
    assert (cpu_mxfp4.swiglu_oai(g, u).double() - want).abs().max() < 1e-5 * want.abs().max()
    assert (kernels.ref.swiglu_oai(g, u).double() - want).abs().max() < 1e-5 * want.abs().max()
    t = torch.randn(5, 4) * 3
    assert torch.allclose(cpu_mxfp4.softmax_rows(t).double(), torch.softmax(t.double(), -1), atol=1e-7)
    w, ids = kernels.Backend("cpu").moe_route(t, 2, False, 0.0, True)
    top, want_ids = torch.topk(t, 2)
    assert torch.equal(ids, want_ids) and torch.allclose(w.double(), torch.softmax(top.double(), -1), atol=1e-7)


# ---------------------------------------------------------------------------------------------
# the model

def test_config(model_files):
    c = load_model(model_files["mxfp4"], progress=lambda m: None).config
    assert (c.arch, c.n_expert, c.n_expert_used, c.n_ff_exp, c.sliding_window) == ("gpt-oss", 8, 4, 64, 8)
    assert c.swa_layers == [True, False, True, False]  # llama.cpp's set_swa_pattern(2)
    m = Model(load_model(model_files["mxfp4"], progress=lambda m: None), "cpu")
    assert [L.window for L in m.layers] == [8, 0, 8, 0] and all(L.sinks is not None for L in m.layers)


# f32 (both) and mxfp4 f32attn: 8/8 as measured (left out for the suite's time); YaRN with the default float16
# cache: 8/8 once its magnitude factor is inside the rope (as ggml_rope_ext), so the cached keys round as llama.cpp's
NEED = {("mxfp4", "default"): 8, ("yarn-mxfp4", "default"): 8}


@pytest.mark.parametrize("variant,config", sorted(NEED))
def test_greedy_matches_llama_server(model_files, recorded, variant, config):
    same, prefix = compare(model_files[variant], recorded, variant, config, SCRIPT)
    assert same >= NEED[(variant, config)], f"{same}/8 identical; matching prefixes {prefix}"


def test_sinks_and_expert_biases_matter(model_files, recorded):
    """Without the sinks, or without the experts' biases, llama-server's tokens are not reproduced."""
    lm = load_model(model_files["f32"], progress=lambda m: None)
    want = recorded["tokens"]["f32"]["default"]
    prompts, expected = recorded["token_prompts"][:3], want["token_prompts"][:3]
    banned = sorted(load_tokenizer(lm.gguf_metadata).eot_ids)
    m = Model(lm, "cpu")
    assert [greedy(m, p, 24, banned, torch.float16) for p in prompts] == expected
    sinks = [L.sinks for L in m.layers]
    for L in m.layers:
        L.sinks = None
    assert [greedy(m, p, 24, banned, torch.float16) for p in prompts] != expected
    for L, s in zip(m.layers, sinks):
        L.sinks = s
        e = L.moe.experts
        L.moe.experts = dataclasses.replace(e, bias=tuple(torch.zeros_like(b) for b in e.bias))
    assert [greedy(m, p, 24, banned, torch.float16) for p in prompts] != expected


class _TritonAttention:
    """A backend's ops with Triton's paged attention (the interpreter runs the whole model's matmuls too
    slowly for the suite: the experts' Triton matmuls, MXFP4 included, are tests/test_mxfp4.py's and
    tests/test_model_triton.py's)."""
    def __init__(self, ops):
        self._ops, self.paged_attention = ops, kernels.Backend("triton").paged_attention

    def __getattr__(self, name):
        return getattr(self._ops, name)


def test_model_triton_interpreter(model_files):
    """The model (a prompt of 9 in one batch, then single tokens past the window of 8) with its attention
    (sinks, alternating windows) on the Triton kernels, against the reference backend."""
    lm = load_model(model_files["f32"], progress=lambda m: None)
    ids = [1, 50, 300, 7, 99, 1000, 2000, 5, 17, 900, 11]

    def run(triton: bool) -> torch.Tensor:
        m = Model(lm, "cpu", backend="torch")
        if triton:
            m.ops = _TritonAttention(m.ops)
        kv = BlockManager(m.new_kv_store(64, dtype=torch.float32))
        seq = SeqKV()
        kv.reserve(seq, len(ids))
        out = [m.forward(kv.store, [SeqBatch(seq, ids[:9], 0)])[0][0]]
        for i in (9, 10):
            kv.commit(seq, i)
            out.append(m.forward(kv.store, [SeqBatch(seq, [ids[i]], i)])[0][0])
        return torch.stack(out)

    ref, tri = run(False), run(True)
    assert (tri - ref).abs().max() < 1e-3 * ref.abs().max()
    assert torch.equal(tri.argmax(-1), ref.argmax(-1))


def test_tensor_parallel_refused(model_files):
    from runtime.parallel.shard import shard_loaded

    lm = load_model(model_files["f32"], progress=lambda m: None)
    with pytest.raises(ValueError, match=r"gpt-oss: tensor parallelism \(-tp\) is not supported for mixture-of-experts"):
        shard_loaded(lm, SimpleNamespace(world=2, rank=0))


def test_make_tiny_model_cli(tmp_path):
    out = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--arch", "gpt-oss",
                    "--type", "mxfp4", "--out", str(out)],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    lm = load_model(out, progress=lambda m: None)
    assert lm.config.arch == "gpt-oss" and lm.file_type == "MXFP4 MoE"
    assert int(lm.weights["blk.0.ffn_gate_exps.weight"].qtype) == 39


# ---------------------------------------------------------------------------------------------
# the harmony template (tests/data/harmony_reference.json, scripts/record_harmony_reference.py)

def test_server_serves_gpt_oss(start_server, model_files, recorded):
    """The server on the MXFP4 model with gpt-oss's template: llama-server's greedy tokens for a text
    prompt; /apply-template renders the template as llama-server does (system, tools, reasoning effort,
    an earlier turn's reasoning and tool call; the date line normalized); a chat whose output has no
    harmony channels fails as llama-server's: 500 "does not match the expected peg-native format", and
    streamed: the role chunk, then that error event (recorded on the F32 model: the answers do not
    depend on the weights)."""
    import json

    from tests.llama_tokens import recording_script

    rec = recording_script("record_harmony_reference")
    CHAT, TEMPLATE, events, normalize = rec.CHAT, rec.TEMPLATE, rec.events, rec.normalize
    ref = json.loads((REPO / "tests" / "data" / "harmony_reference.json").read_text())
    srv = start_server("-m", str(model_files["mxfp4"]), "-c", "1024", "-np", "1", "--jinja",
                       "--chat-template-file", str(TEMPLATE))
    want = recorded["tokens"]["mxfp4"]["default"]["text_prompts"][0]
    r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=recorded["text_prompts"][0]),
                   timeout=120)
    assert r.status_code == 200 and r.json()["tokens"] == want, r.text
    for conv, want in zip(ref["conversations"], ref["prompts"]):
        r = httpx.post(srv.url + "/apply-template", json=conv, timeout=60)
        assert r.status_code == 200, r.text
        assert normalize(r.json()["prompt"]) == want
    r = httpx.post(srv.url + "/v1/chat/completions", json=CHAT, timeout=120)
    assert (r.status_code, r.json()) == (ref["whole"]["status"], ref["whole"]["body"])
    r = httpx.post(srv.url + "/v1/chat/completions", json=dict(CHAT, stream=True), timeout=120)
    got, want = events(r.text), ref["stream"]["events"]
    assert r.status_code == ref["stream"]["status"] and len(got) == len(want)
    assert got[0]["choices"] == want[0]["choices"] and got[1] == want[1]

"""phi3 (runtime/model/arch/phi3.py) on the tiny random models of scripts/record_phi3_reference.py:

- the loader splits the fused `attn_qkv` and the gate+up `ffn_up` into row views of the file,
  ignores `phi3.attention.sliding_window` (llama.cpp b1-0c1e570 disables phi3's SWA) and refuses
  LongRoPE files (`rope_factors_long/short`);
- the forward (torch and CPU backends, prefill then decode, past the file's sliding window) against
  an independent float64 one written here from llama.cpp's src/models/phi3.cpp, on the tensors as
  gguf-py reads and dequantizes them (no runtime code);
- greedy tokens equal to llama-server b1-0c1e570's on the same files (tests/data/phi3_greedy.json,
  recorded by scripts/record_phi3_reference.py with llama-server's defaults and with float32
  attention, `-ctk f32 -ctv f32 -fa off`), and the server serving the model.
"""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

from runtime.model import tiny_model
from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from tests.llama_tokens import compare, float_order, recorded_tokens, variant_files
from tests.kernel_oracles import rms_norm_oracle, rope_neox_f64

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "record_phi3_reference"  # scripts/record_phi3_reference.py wrote tests/data/phi3_greedy.json


@pytest.fixture(scope="module")
def recorded() -> dict:
    return recorded_tokens("phi3_greedy.json")


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return variant_files(SCRIPT, tmp_path_factory.mktemp("phi3"))


# ---------------------------------------------------------------------------------------------
# float64 reference forward, from the file as gguf-py reads it


def read_file(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(hyper-parameters, every tensor dequantized to float64 [rows, cols] / [n])."""
    r = GGUFReader(str(path))

    def field(key):
        f = r.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    hp = {k: field(f"phi3.{k}") for k in ("block_count", "embedding_length", "attention.head_count",
                                           "attention.head_count_kv", "feed_forward_length",
                                           "rope.freq_base", "attention.layer_norm_rms_epsilon")}
    hp["sliding_window"] = field("phi3.attention.sliding_window") if "phi3.attention.sliding_window" in r.fields else 0
    ts = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        shape = [int(n) for n in reversed(t.shape.tolist())]  # GGUF ne reversed: [rows, cols]
        ts[t.name] = torch.from_numpy(x.reshape(shape).copy())
    return hp, ts


def reference_logits(hp: dict, w: dict[str, torch.Tensor], ids: list[int], window: int = 0) -> torch.Tensor:
    """float64 logits [T, V] of a whole sequence, llama.cpp's phi3 graph. `window` > 0: attend to the
    last `window` positions only (what llama.cpp does NOT do for phi3; to show the test would see it)."""
    L, C, H, KVH = (hp[k] for k in ("block_count", "embedding_length", "attention.head_count",
                                    "attention.head_count_kv"))
    F, base, eps = hp["feed_forward_length"], hp["rope.freq_base"], hp["attention.layer_norm_rms_epsilon"]
    D = C // H
    T = len(ids)
    x = w["token_embd.weight"][torch.tensor(ids)]
    pos = torch.arange(T)
    masked = pos[None, :] > pos[:, None]
    if window:
        masked |= pos[None, :] <= pos[:, None] - window
    for il in range(L):
        p = f"blk.{il}."
        h = rms_norm_oracle(x, w[p + "attn_norm.weight"], eps)
        qkv = h @ w[p + "attn_qkv.weight"].T  # [T, C + 2 KVH D]: q, k, v side by side
        q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=1)
        q = rope_neox_f64(q.reshape(T, H, D), pos, base) / math.sqrt(D)
        k = rope_neox_f64(k.reshape(T, KVH, D), pos, base)
        k, v = k.repeat_interleave(H // KVH, 1), v.reshape(T, KVH, D).repeat_interleave(H // KVH, 1)
        s = torch.einsum("thd,shd->hts", q, k).masked_fill(masked, -math.inf)
        o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, H * D)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rms_norm_oracle(x, w[p + "ffn_norm.weight"], eps)
        gu = h @ w[p + "ffn_up.weight"].T  # [T, 2F]: ggml_swiglu = silu(first half) * second half
        g, u = gu[:, :F], gu[:, F:]
        x = x + (g * torch.sigmoid(g) * u) @ w[p + "ffn_down.weight"].T
    x = rms_norm_oracle(x, w["output_norm.weight"], eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T


def _forward_steps(m: Model, ids: list[int], prefill: int) -> torch.Tensor:
    """Logits [len(ids) - prefill + 1, V]: a prefill chunk, then one token at a time."""
    kv = BlockManager(m.new_kv_store(128, dtype=torch.float32))
    seq = SeqKV()
    kv.reserve(seq, len(ids))
    logits, _ = m.forward(kv.store, [SeqBatch(seq, ids[:prefill], 0)])
    out = [logits[0]]
    seq.n_tokens = prefill
    for i in range(prefill, len(ids)):
        logits, _ = m.forward(kv.store, [SeqBatch(seq, [ids[i]], i)])
        out.append(logits[0])
        seq.n_tokens = i + 1
    return torch.stack(out)


# 26 tokens: past the files' sliding window of 16
PROMPT = [1, 50, 300, 7, 99, 1000, 2000, 5, 17, 2500, 36, 72, 144, 288, 576, 1152, 2304, 11, 22,
          3, 1415, 926, 535, 897, 932, 384]


def test_config_and_split_weights(model_files):
    path = model_files["f32"]
    lm = load_model(path, progress=lambda m: None)
    c = lm.config
    assert (c.arch, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == ("phi3", 4, 2, 32, 256)
    assert c.rope_neox and not c.has_qkv_bias and not c.has_qk_norm
    assert lm.gguf_metadata["phi3.attention.sliding_window"] == 16
    assert c.sliding_window == 0 and not c.swa_layers  # llama.cpp b1-0c1e570: "Phi SWA is currently disabled"
    _, ts = read_file(path)
    w = lm.weights
    assert not any(n.endswith(("attn_qkv.weight",)) for n in w)
    for il in range(c.n_layer):
        p = f"blk.{il}."
        qkv, up = ts[p + "attn_qkv.weight"], ts[p + "ffn_up.weight"]
        parts = [w[p + n].data.double() for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
        assert [x.shape for x in parts] == [(128, 128), (64, 128), (64, 128)]
        assert torch.equal(torch.cat(parts), qkv)
        assert torch.equal(w[p + "ffn_gate.weight"].data.double(), up[:256])
        assert torch.equal(w[p + "ffn_up.weight"].data.double(), up[256:])
        # views of the one mapped tensor: q's rows are followed by k's in memory
        q, k = w[p + "attn_q.weight"], w[p + "attn_k.weight"]
        assert q.mapped and k.data.data_ptr() == q.data.data_ptr() + q.data.numel() * q.data.element_size()
    lq = load_model(model_files["q4_k"], progress=lambda m: None)
    q = lq.weights["blk.0.attn_q.weight"]
    assert (q.qtype, q.rows, q.cols) == (Q.Q4_K, 256, 256)
    assert lq.weights["blk.0.ffn_gate.weight"].rows == lq.weights["blk.0.ffn_up.weight"].rows == 512


def test_longrope_refused(tmp_path, monkeypatch):
    shapes = tiny_model.tensor_shapes

    def with_longrope(spec, n_vocab):
        return shapes(spec, n_vocab) + [("rope_factors_long.weight", (16,)), ("rope_factors_short.weight", (16,))]

    monkeypatch.setattr(tiny_model, "tensor_shapes", with_longrope)
    path = tiny_model.write_tiny_model(tmp_path / "longrope.gguf", tiny_model.PHI3_SPEC, vocab="builtin")
    with pytest.raises(ValueError, match="LongRoPE"):
        load_model(path, progress=lambda m: None)


@pytest.mark.parametrize("variant,backend", [("f32", "torch"), ("f32", "cpu"), ("q8_0", "torch"), ("q8_0", "cpu"),
                                             ("q4_k", "torch"), ("q4_k", "cpu")])
def test_forward_matches_float64_reference(model_files, variant, backend):
    path = model_files[variant]
    hp, ts = read_file(path)
    assert hp["sliding_window"] == 16 and len(PROMPT) > 16
    m = Model(load_model(path, progress=lambda m: None), "cpu", backend=backend)
    got = _forward_steps(m, PROMPT, 20).double()
    want = reference_logits(hp, ts, PROMPT)[19:]
    rel = float((got - want).norm() / want.norm())
    # float32 paths agree to rounding; the CPU's integer dots quantize the activations to 8 bits
    tol = 1e-4 if variant == "f32" or backend == "torch" else {"q8_0": 2e-2, "q4_k": 5e-2}[variant]
    assert rel < tol, rel
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # the window, were it applied, would change the logits by far more than that tolerance
    windowed = reference_logits(hp, ts, PROMPT, window=hp["sliding_window"])[19:]
    assert float((windowed - want).norm() / want.norm()) > 10 * tol


def test_model_triton_backend_interpreter(model_files):
    lm = load_model(model_files["q8_0"], progress=lambda m: None)
    got = _forward_steps(Model(lm, "cpu", backend="triton"), PROMPT[:6], 4)
    want = _forward_steps(Model(lm, "cpu", backend="torch"), PROMPT[:6], 4)
    # the Triton decode matmuls quantize activations to q8_1 (llama.cpp's CUDA dot products), so the
    # logits agree to ~3e-2 relative (tests/test_model_triton.py), and the greedy token where clear
    assert float((got - want).norm() / want.norm()) < 3e-2
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * float((got - want).abs().max())
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


# ---------------------------------------------------------------------------------------------
# llama-server's tokens


# prompts (of 8) whose 24 greedy tokens must equal llama-server's, per (variant, configuration of
# scripts/record_phi3_reference.py), as measured (2026-12-04). F32 weights: every prompt in both
# configurations (the architecture itself; llama-server's top-10 log-probabilities agree to 2e-6).
# Quantized weights: on some inputs tritium's CPU path and llama.cpp's differ by ~5e-3 in the
# log-probabilities (e.g. the Q8_0 file, tokens 100..104, float32 attention), and the random model's
# top-2 logits are often closer than that, so some prompts part. That difference is not phi3's:
# the same weights written as a qwen2 file (q/k/v and gate/up separate) give llama-server's phi3
# numbers to 1e-6 and tritium's qwen2 the same 5e-3 difference. "default" (float16 flash attention
# in llama-server) adds the rounding tests/test_qwen3moe.py's NEED describes.
# 2026-12-05: with llama.cpp's flash attention reproduced (float16 accumulator) the float32 file's
# "default" prompt 2 parts at token 7 on a tie of 4e-4 in the logits (1452 2.00946 against 1654
# 2.00904): float32 matmuls are not in llama.cpp's order (only the quantized ones are), so 7.
NEED = {("f32", "f32attn"): 8, ("q8_0", "f32attn"): 7, ("q4_k", "f32attn"): 7,
        ("f32", "default"): 7, ("q8_0", "default"): 3, ("q4_k", "default"): 3}
# On CPUs without AVX-512 (tests/data/avx2/phi3_greedy.json, llama-server built for AVX2; measured
# 2026-12-07 on an AVX2-only AMD EPYC): the same except Q8_0 "default", 2/8; the six prompts that part
# do so where tritium's top two logits lie 3e-3 to 1.7e-2 apart (llama-server's token second), the
# quantized-path difference described above.
if float_order() != "avx512":
    NEED[("q8_0", "default")] = 2


@pytest.mark.parametrize("variant,config", sorted(NEED))
def test_greedy_matches_llama_server(model_files, recorded, variant, config):
    same, prefix = compare(model_files[variant], recorded, variant, config, "scripts/record_phi3_reference.py")
    assert same >= NEED[(variant, config)], f"{same}/8 identical; matching prefixes {prefix}"


def test_server_serves_phi3(start_server, model_files, recorded):
    """/tokenize and /completion on the text and token prompts: llama-server's tokens."""
    srv = start_server("-m", str(model_files["f32"]), "-c", "512", "-np", "1")
    want = recorded["tokens"]["f32"]["default"]
    for text, ids, toks in zip(recorded["text_prompts"], want["text_prompt_ids"], want["text_prompts"]):
        r = httpx.post(srv.url + "/tokenize", json={"content": text, "add_special": True}, timeout=60)
        assert r.json()["tokens"] == ids
        r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=text), timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == toks
    # (the second token prompt parts on a 4e-4 tie of the float32 file: see NEED below)
    for prompt, toks in zip(recorded["token_prompts"][:1], want["token_prompts"]):
        r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=prompt), timeout=120)
        assert r.json()["tokens"] == toks


def test_make_tiny_model_cli(tmp_path):
    out = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--arch", "phi3",
                    "--type", "q8_0", "--kv-heads", "4", "--sliding-window", "0", "--out", str(out)],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    lm = load_model(out, progress=lambda m: None)
    c = lm.config
    assert (c.arch, c.n_head, c.n_head_kv, c.n_ff, c.n_vocab) == ("phi3", 4, 4, 256, 3003)
    assert "phi3.attention.sliding_window" not in lm.gguf_metadata
    assert lm.weights["blk.1.attn_v.weight"].qtype == Q.Q8_0 and lm.weights["blk.1.attn_v.weight"].rows == 128

"""gemma3 (runtime/model/arch/gemma.py) on the tiny random models of scripts/record_gemma3_reference.py:

- the file loads as intended: 6 layers, layers 0-4 local (window 8, RoPE base 10000 by default or
  the file's `rope.freq_base_swa`), layer 5 global (base 1e6), q/k norms, post-norms, the output
  tied to the token embeddings, n_head * head_dim != n_embd;
- greedy tokens equal to llama-server b1-0c1e570's on the same files (tests/data/gemma3_greedy.json,
  recorded by scripts/record_gemma3_reference.py with llama-server's defaults and with float32
  attention, `-ctk f32 -ctv f32 -fa off`); every sequence but one is longer than the window, and
  the same weights without it (or with the global RoPE base on local layers) part from them; the
  server serving the f32 model (with and without --swa-full);
- scripts/make_tiny_model.py --arch gemma3.
"""
from __future__ import annotations

import os

if os.environ.get("TRITIUM_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from runtime.model.loader import load_model
from tests.llama_tokens import agreement, compare, recorded_tokens, variant_files

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "record_gemma3_reference"  # scripts/record_gemma3_reference.py wrote tests/data/gemma3_greedy.json


@pytest.fixture(scope="module")
def recorded() -> dict:
    return recorded_tokens("gemma3_greedy.json")


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return variant_files(SCRIPT, tmp_path_factory.mktemp("gemma3"))


def test_file_and_config(model_files):
    lm = load_model(model_files["f32"], progress=lambda m: None)
    c = lm.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == ("gemma3", 6, 128, 4, 1, 64, 256)
    assert c.rope_neox and c.has_qk_norm
    assert c.sliding_window == 8 and c.swa_layers == [True] * 5 + [False]
    assert (c.rope_freq_base, c.rope_freq_base_swa) == (1e6, 10000.0)
    assert "gemma3.rope.freq_base_swa" not in lm.gguf_metadata
    names = {t.name for t in GGUFReader(str(model_files["f32"])).tensors}
    assert "output.weight" not in names and "token_embd.weight" in names  # tied output
    w = lm.weights
    for il in range(6):
        p = f"blk.{il}."
        for n in ("post_attention_norm.weight", "post_ffw_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"):
            assert p + n in w, p + n
        assert (w[p + "attn_q.weight"].rows, w[p + "attn_q.weight"].cols) == (256, 128)  # 4 heads of 64
        assert (w[p + "attn_output.weight"].rows, w[p + "attn_output.weight"].cols) == (128, 256)
    # gemma's norms hold 1 + w: around 1, not all ones
    ffn_norm = w["blk.0.ffn_norm.weight"].data.float()
    assert 0.5 < float(ffn_norm.mean()) < 1.5 and float(ffn_norm.std()) > 0.1
    lq = load_model(model_files["q8_0"], progress=lambda m: None)
    assert lq.config.rope_freq_base_swa == 5000.0 and lq.weights["blk.0.attn_q.weight"].qtype == Q.Q8_0
    lk = load_model(model_files["q4_k"], progress=lambda m: None)
    assert (lk.config.n_embd, lk.config.head_dim) == (256, 256)
    assert lk.weights["blk.0.attn_q.weight"].qtype == Q.Q4_K and lk.weights["blk.0.attn_q.weight"].rows == 1024


# ---------------------------------------------------------------------------------------------
# llama-server's tokens


# prompts (of 8) whose 24 greedy tokens must equal llama-server's, per (variant, configuration of
# scripts/record_gemma3_reference.py), as measured (2026-12-04). F32 weights: every prompt in both
# configurations (the gemma3 graph itself: window, per-layer RoPE bases, q/k norms, post-norms,
# embedding scale, GeGLU, tied output). Quantized weights: tritium's CPU path and llama.cpp's differ
# by a few 1e-3 in the logits on quantized matrices (the 8-bit activation quantization; see
# tests/test_phi3.py's NEED: not an architecture's), and the random model's top-2 logits are often
# closer than that, so some prompts part (q8_0 f32attn: prompts 3 and 7 after 16 and 19 tokens;
# q4_k f32attn: prompts 5 and 7 after 3 and 23). "default" (float16 flash attention in llama-server)
# adds the rounding tests/test_qwen3moe.py's NEED describes (q8_0: 1/8 identical, q4_k: 4/8).
# q4_k f32attn is 5 on a 2-core AMD EPYC (2026-12-05, same code as the Intel Xeon's 6): prompt 3
# parts there after 6 tokens, where tritium's top-2 logits are 1.05408 and 1.05239 (llama-server's
# token second, 0.0017 behind), within the few 1e-3 above: the compiled kernels round differently
# per CPU.
NEED = {("f32", "f32attn"): 8, ("q8_0", "f32attn"): 6, ("q4_k", "f32attn"): 5,
        ("f32", "default"): 8, ("q8_0", "default"): 1, ("q4_k", "default"): 4}


@pytest.mark.parametrize("variant,config", sorted(NEED))
def test_greedy_matches_llama_server(model_files, recorded, variant, config):
    same, prefix = compare(model_files[variant], recorded, variant, config, "scripts/record_gemma3_reference.py")
    assert same >= NEED[(variant, config)], f"{same}/8 identical; matching prefixes {prefix}"


@pytest.mark.parametrize("change", [dict(sliding_window=0), dict(rope_freq_base_swa=1e6)])
def test_recorded_tokens_see_window_and_local_rope(tmp_path, recorded, change):
    """The same weights without the window, or with the global RoPE base on the local layers, give
    other tokens than llama-server's: the greedy test checks both."""
    from dataclasses import replace

    from runtime.model.tiny_model import GEMMA3_SPEC, write_tiny_model

    path = write_tiny_model(tmp_path / "changed.gguf", replace(GEMMA3_SPEC, **change), vocab="builtin")
    same, prefix = agreement(path, recorded, "f32", "f32attn")
    assert same <= 2, f"{same}/8 identical; matching prefixes {prefix}"


@pytest.mark.parametrize("swa_full", [False, True])
def test_server_serves_gemma3(start_server, model_files, recorded, swa_full):
    """/tokenize and /completion on every recorded prompt: llama-server's tokens, with the local
    layers' cache holding only their window (the default) and with --swa-full."""
    srv = start_server("-m", str(model_files["f32"]), "-c", "512", "-np", "1", *(["--swa-full"] if swa_full else []))
    want = recorded["tokens"]["f32"]["default"]
    for text, ids, toks in zip(recorded["text_prompts"], want["text_prompt_ids"], want["text_prompts"]):
        r = httpx.post(srv.url + "/tokenize", json={"content": text, "add_special": True}, timeout=60)
        assert r.json()["tokens"] == ids
        r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=text), timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == toks
    for prompt, toks in zip(recorded["token_prompts"], want["token_prompts"]):
        r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=prompt), timeout=120)
        assert r.json()["tokens"] == toks


def test_make_tiny_model_cli(tmp_path):
    out = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--arch", "gemma3",
                    "--type", "q8_0", "--layers", "12", "--sliding-window", "16", "--rope-base-swa", "20000",
                    "--out", str(out)], check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    lm = load_model(out, progress=lambda m: None)
    c = lm.config
    assert (c.arch, c.n_layer, c.head_dim, c.n_vocab, c.sliding_window) == ("gemma3", 12, 64, 3003, 16)
    assert c.swa_layers == ([True] * 5 + [False]) * 2 and c.rope_freq_base_swa == 20000.0
    assert lm.weights["blk.11.attn_v.weight"].qtype == Q.Q8_0

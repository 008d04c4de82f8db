"""smollm3 (runtime/model/arch/smollm3.py: llama with a NoPE layer every 4th) on the tiny random
models of scripts/record_smollm3_reference.py: greedy tokens equal to llama-server b1-0c1e570's
(tests/data/smollm3_greedy.json, recorded by `python scripts/record_smollm3_reference.py` with an
AVX2 build on an AVX2 machine; with every layer rotated, 3 of the 8 f32 prompts part from it), the
NoPE layers' rotation an exact identity, and the server serving the model.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

import kernels
from runtime.model.decoder import Model
from runtime.model.loader import load_model
from tests.llama_tokens import compare, recorded_tokens, variant_files

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return recorded_tokens("smollm3_greedy.json")


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return variant_files("record_smollm3_reference", tmp_path_factory.mktemp("smollm3"))


# measured 2026-12-07 on this AVX2 machine: 8/8 for f32 and q8_0 in both configurations
NEED = {("f32", "default"): 8, ("q8_0", "f32attn"): 8}


@pytest.mark.parametrize("variant,config", sorted(NEED))
def test_greedy_matches_llama_server(model_files, recorded, variant, config):
    same, prefix = compare(model_files[variant], recorded, variant, config, "scripts/record_smollm3_reference.py")
    assert same >= NEED[(variant, config)], f"{same}/8 identical; matching prefixes {prefix}"


def test_nope_layers(model_files):
    """Layers 3 and 7 of 8 use no RoPE: their rotation leaves q and k bit for bit as they are."""
    m = Model(load_model(model_files["f32"], progress=lambda m: None), "cpu")
    nope = [i for i, L in enumerate(m.layers) if not bool(L.inv_freq.any())]
    assert nope == [3, 7]
    x = torch.randn(5, 4, 32)
    pos = torch.tensor([0, 1, 7, 100, 1000])
    L = m.layers[3]
    assert torch.equal(m.ops.rope(x, pos, L.inv_freq, m.neox, L.rope_theta_scale), x)
    assert not torch.equal(kernels.rope(x, pos, m.layers[0].inv_freq, m.neox), x)


def test_server_serves_smollm3(start_server, model_files, recorded):
    srv = start_server("-m", str(model_files["f32"]), "-c", "512", "-np", "1")
    want = recorded["tokens"]["f32"]["default"]
    for text, toks in zip(recorded["text_prompts"][:2], want["text_prompts"]):
        r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=text), timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == toks


def test_make_tiny_model_cli(tmp_path):
    out = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--arch", "smollm3",
                    "--type", "q8_0", "--out", str(out)],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert load_model(out, progress=lambda m: None).config.arch == "smollm3"

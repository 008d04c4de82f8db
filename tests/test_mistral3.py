"""mistral3 (runtime/model/arch/mistral3.py: llama with Llama 4's attention temperature tuning and
YaRN's log multiplier) on the tiny random models of scripts/record_mistral3_reference.py: greedy
tokens equal to llama-server b1-0c1e570's (tests/data/mistral3_greedy.json, recorded by
`python scripts/record_mistral3_reference.py` with an AVX2 build on an AVX2 machine; measured
2026-12-07: 8/8 on every variant and configuration, 0/8 with the temperature tuning left out on
"f32" and 0/8 with the log multiplier left out on "yarn-f32"), and the server serving the model.
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from runtime.model.arch.mistral3 import temperature
from runtime.model.loader import load_model
from runtime.model.rope import rope_mscale
from tests.llama_tokens import compare, recorded_tokens, variant_files

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return recorded_tokens("mistral3_greedy.json")


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return variant_files("record_mistral3_reference", tmp_path_factory.mktemp("mistral3"))


NEED = {("f32", "default"): 8, ("q8_0", "f32attn"): 8, ("yarn-f32", "default"): 8}


@pytest.mark.parametrize("variant,config", sorted(NEED))
def test_greedy_matches_llama_server(model_files, recorded, variant, config):
    same, prefix = compare(model_files[variant], recorded, variant, config, "scripts/record_mistral3_reference.py")
    assert same >= NEED[(variant, config)], f"{same}/8 identical; matching prefixes {prefix}"


def test_temperature():
    """1 within the original context, then log(floor(p / n) + 1) * scale + 1 in double, as float."""
    t = temperature(torch.tensor([0, 7, 8, 23, 24, 1000]), 0.5, 8)
    want = [1.0, 1.0, 1.3465735902799727, 1.5493061443340548, 1.6931471805599454, 3.418140953475739]
    assert t.dtype == torch.float32 and t.tolist() == torch.tensor(want, dtype=torch.float32).tolist()


def test_config(model_files):
    c = load_model(model_files["yarn-f32"], progress=lambda m: None).config
    assert (c.arch, c.attn_temp_scale, c.attn_temp_floor, c.rope_scaling_type) == ("mistral3", 0.5, 8, "yarn")
    # log multiplier 1: the magnitude scale is get_mscale(4, 1) / get_mscale(4, 1) = 1, not 1 + 0.1 ln 4
    assert c.yarn_log_mul == 1.0 and abs(rope_mscale(c) - 1.0) < 1e-6
    assert abs(rope_mscale(dataclasses.replace(c, yarn_log_mul=0.0)) - (1 + 0.1 * math.log(4.0))) < 1e-6


def test_server_serves_mistral3(start_server, model_files, recorded):
    srv = start_server("-m", str(model_files["f32"]), "-c", "512", "-np", "1")
    want = recorded["tokens"]["f32"]["default"]
    for text, toks in zip(recorded["text_prompts"][:2], want["text_prompts"]):
        r = httpx.post(srv.url + "/completion", json=dict(recorded["request"], prompt=text), timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == toks


def test_make_tiny_model_cli(tmp_path):
    out = tmp_path / "m.gguf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--arch", "mistral3",
                    "--type", "q8_0", "--out", str(out)],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert load_model(out, progress=lambda m: None).config.arch == "mistral3"

"""Greedy tokens of a tiny generated model against llama-server's, as recorded by the
scripts/record_*_reference.py scripts (tests/data/*_greedy.json: per variant its sha256 and, per
server configuration, the tokens of the token prompts and of the text prompts); and the real
models' files for the tests that use them (`real_model_path`)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from runtime.model.kv_store import SeqKV
from runtime.serving.blocks import BlockManager
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]


def recording_script(name: str):
    """scripts/<name>.py as a module: it writes the tiny models (`write_variant`) whose tokens it recorded.
    scripts/ is on the import path as when the script runs (`python scripts/<name>.py`): its siblings import."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.append(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def real_model_path(m) -> Path:
    """The cached file of a real model (runtime.model.model_files.QWEN / GEMMA), or skip the test with the
    fetch script's name."""
    from runtime.model.model_files import FETCH_HINT, cached_path

    p = cached_path(m)
    if p is None:
        pytest.skip(f"{m.filename} is not in the model cache: {FETCH_HINT}")
    return p


def variant_files(script_name: str, out_dir: Path) -> dict[str, Path]:
    """Every tiny model scripts/<script_name>.py recorded (its `variants()`), written into out_dir."""
    script = recording_script(script_name)
    return {name: script.write_variant(name, out_dir) for name in script.variants()}


def float_order() -> str:
    """The float order llama.cpp's CPU backend takes on this machine, built natively: "avx512" (AVX-512F:
    16-lane vectors and reduction trees, its AVX-512 exp and SwiGLU) or "avx2" (8 lanes; also the
    portable order's nearest recording). Greedy tokens of chaotic models depend on it (on the real Qwen
    model, 4 of 8 prompts differ between the two), so each order has its own recording."""
    from kernels.cpu import native

    return "avx512" if native.supported_isas()[0] == "avx512" else "avx2"


def reference_file(data_name: str) -> Path:
    """tests/data/<data_name> as recorded by llama-server built for this machine's float order: the
    AVX-512 recording at tests/data/, the AVX2 one at tests/data/avx2/ (the same scripts, run with an
    llama-server built without AVX-512: kernels/README.md, "Numerics")."""
    base = REPO / "tests" / "data"
    other = base / float_order() / data_name
    return other if float_order() != "avx512" and other.exists() else base / data_name


def recorded_tokens(data_name: str) -> dict:
    """tests/data/<data_name>: llama-server's recorded tokens for this machine's float order."""
    return json.loads(reference_file(data_name).read_text())


def greedy(m: Model, prompt: list[int], n: int, banned: list[int], cache: torch.dtype, store=None) -> list[int]:
    """n greedy tokens, end-of-generation tokens `banned` (llama-server's ignore_eos); the prompt in
    llama-server's batches (on a sliding-window model, ending where it saves context checkpoints).
    `store`: the KV store to use (an empty KVStore with room for them; default: one of `cache`'s type)."""
    from runtime.serving.plan import prompt_breaks

    kv = BlockManager(store if store is not None else m.new_kv_store(len(prompt) + n + 16, dtype=cache))
    rs = m.new_state(1)  # hybrid models' recurrent state (None for the others)
    cell = 0 if rs is not None else -1
    seq = SeqKV()
    kv.reserve(seq, len(prompt) + n)
    ends = (list(prompt_breaks(len(prompt), 2048, 512)) if any(L.window for L in m.layers) else []) + [len(prompt)]
    at = 0
    for e in ends:
        logits, _ = m.forward(kv.store, [SeqBatch(seq, prompt[at:e], at, rs=cell)], rs)
        at = e
    seq.n_tokens = len(prompt)
    out = []
    for _ in range(n):
        row = logits[0].clone()
        row[banned] = -math.inf
        tok = int(row.argmax())
        out.append(tok)
        if len(out) == n:
            break
        logits, _ = m.forward(kv.store, [SeqBatch(seq, [tok], seq.n_tokens, rs=cell)], rs)
        seq.n_tokens += 1
    return out


def compare(path: Path, recorded: dict, variant: str, config: str, script: str) -> tuple[int, list[int]]:
    """`agreement` for the recorded variant's file (its sha256 checked first: `script` records it)."""
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded["sha256"][variant], \
        f"the generated model differs from the recorded one: rerun {script}"
    return agreement(path, recorded, variant, config)


def agreement(path: Path, recorded: dict, variant: str, config: str) -> tuple[int, list[int]]:
    """(prompts whose tokens equal llama-server's, matching prefix length per prompt) for the model
    at `path` against the recorded tokens of `variant` under one server configuration ("f32attn":
    float32 KV cache)."""
    lm = load_model(path, progress=lambda m: None)
    m = Model(lm, "cpu")  # the server's path (CPU backend)
    banned = sorted(load_tokenizer(lm.gguf_metadata).eot_ids)
    want = recorded["tokens"][variant][config]
    prompts = recorded["token_prompts"] + want["text_prompt_ids"]
    expected = want["token_prompts"] + want["text_prompts"]
    cache = torch.float32 if config == "f32attn" else torch.float16  # as llama-server's -ctk / -ctv
    got = [greedy(m, p, recorded["n_predict"], banned, cache) for p in prompts]
    assert len(prompts) == 8
    prefix = [next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), len(e)) for g, e in zip(got, expected)]
    return sum(g == e for g, e in zip(got, expected)), prefix

#!/usr/bin/env python3
"""Records llama-server b1-0c1e570's greedy tokens with quantized KV caches (-ctk / -ctv) on tiny
generated models into tests/data/<float order>/kv_quant_tiny.json (tests/test_kv_quant_tiny.py
compares tritium's with them): gpt-oss (attention sinks, heads of 64: K and V Hadamard-rotated),
gemma4 (sliding heads of 32 and full heads of 64: no rotation, llama.cpp tests layer 0's head size;
and a variant with heads of 64 / 128: each of its two caches rotated by its own size), and a llama
with heads of 64, also with LLAMA_ATTN_ROT_DISABLE=1 (the rotation turned off) and the one tritium
runs with -tp 2.

The models are generated here, deterministically (their sha256 are recorded and the tests check
them), so that the tests regenerate the same files without the reference binary.

    python scripts/record_kv_quant_tiny.py --server /work/lsb/llama-server

Each configuration: `llama-server -m MODEL -c 512 -np 1 --no-warmup --cache-ram 0 -ctk K -ctv V`
(with its environment), then scripts/record_moe_reference.py's request (greedy, 24 tokens,
ignore_eos) for each of its token prompts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import record_moe_reference as moe_ref  # noqa: E402
from record_real_references import wait_ready  # noqa: E402
from runtime.model.tiny_model import BUILTIN_SPEC, GEMMA4_SPEC, GPTOSS_SPEC, TinyModelSpec  # noqa: E402

ROT_OFF = {"LLAMA_ATTN_ROT_DISABLE": "1"}


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"gpt-oss": GPTOSS_SPEC, "gemma4": GEMMA4_SPEC,
            "gemma4-rot": replace(GEMMA4_SPEC, head_dim=128, head_dim_swa=64, seed=33),
            "llama64": replace(BUILTIN_SPEC, head_dim=64, name="tiny-random-llama64", seed=41, init_std=0.05)}


# model -> [(cache type of K, of V, environment)]
CONFIGS: dict[str, list[tuple[str, str, dict]]] = {
    "gpt-oss": [("q8_0", "q8_0", {}), ("q4_0", "q4_1", {})],
    "gemma4": [("q8_0", "q8_0", {}), ("q5_0", "iq4_nl", {})],
    "gemma4-rot": [("q4_0", "q4_0", {})],
    "llama64": [("q4_0", "q4_0", {}), ("q4_0", "q4_0", ROT_OFF), ("q8_0", "q5_1", {})],
}


def config_name(k: str, v: str, env: dict) -> str:
    return f"{k}/{v}" + "".join(f" {key}={val}" for key, val in sorted(env.items()))


def write_variant(name: str, out_dir: Path) -> Path:
    spec = variants()[name]
    return moe_ref.write_spec(spec.arch, name, spec, out_dir)


def server_args(model: Path, k: str, v: str) -> list[str]:
    return ["-m", str(model), "-c", "512", "-np", "1", "--no-warmup", "--cache-ram", "0", "-ctk", k, "-ctv", v]


def record(server: str, model: Path, port: int, k: str, v: str, env: dict) -> list[list[int]]:
    proc = subprocess.Popen([server, *server_args(model, k, v), "--port", str(port)], env=dict(os.environ, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout=120)
        return [moe_ref.greedy(url, p) for p in moe_ref.TOKEN_PROMPTS]
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    from tests.llama_tokens import float_order

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--port", type=int, default=8271)
    a = ap.parse_args()
    out = {"reference": "llama-server b1-0c1e570", "command": " ".join(["python", *sys.argv]),
           "server_args": server_args(Path("MODEL"), "K", "V"), "request": moe_ref.request("PROMPT"),
           "token_prompts": moe_ref.TOKEN_PROMPTS, "sha256": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as d:
        for name in variants():
            model = write_variant(name, Path(d))
            out["sha256"][name] = moe_ref.sha256(model)
            out["tokens"][name] = {config_name(k, v, env): record(a.server, model, a.port, k, v, env)
                                   for k, v, env in CONFIGS[name]}
            print(name, "recorded", flush=True)
    order = float_order()
    dest = ROOT / "tests" / "data" / ("" if order == "avx512" else order) / "kv_quant_tiny.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

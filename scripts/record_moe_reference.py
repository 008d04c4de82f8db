#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random qwen3moe models into
tests/data/qwen3moe_greedy.json (tests/test_qwen3moe.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.MOE_SPEC in
F32 and Q8_0, and a 256-dim Q4_K one), so that the tests regenerate the very same files (their
sha256 are recorded and checked) without the reference binary. Each model is recorded twice:
with llama-server's defaults ("default": float16 KV cache, flash attention on), and with float32
attention ("f32attn": `-ctk f32 -ctv f32 -fa off`). ggml's CPU flash attention rounds to float16
even with a float32 cache (the output of a query that sees one key differs from that key's V by
float16 rounding: 2.4e-4 relative), while tritium's CPU attention is float32; with `-fa off` and a
float32 cache llama.cpp's attention output equals a float64 one to 7e-8. That 3e-4 attention
difference is the only one between the two (substituting llama.cpp's attention outputs into
tritium's forward reproduces its logits to 1e-7, quantized weights included), but with quantized
weights the 8-bit activation quantization amplifies it to ~2% of the logits, so greedy tokens part
after a few steps. The "f32attn" recordings therefore check the mixture-of-experts computation
token for token on every weight type; the "default" ones are what a user of llama-server gets.

    python scripts/record_moe_reference.py --server /work/lsb/llama-server \\
        --out tests/data/qwen3moe_greedy.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.model.tiny_model import MOE_SPEC, TinyModelSpec, write_tiny_model  # noqa: E402
from record_real_references import wait_ready  # noqa: E402

# token-id prompts (no tokenizer in the way; llama-server adds nothing to a token array) and text
# prompts (through both servers' tokenizers of the built-in vocabulary)
TOKEN_PROMPTS = [[1, 50, 300, 7, 99, 1000, 2000, 5], [2500], [17, 17, 17, 17], [900, 1800, 2700, 36, 72, 144, 288, 576, 1152, 2304, 11, 22],
                 [3, 1415, 926, 535, 897, 932, 384, 626, 433, 832, 795, 28, 841, 971, 693, 99, 375, 105, 820, 974]]
TEXT_PROMPTS = ["Hello, my name is", "def fibonacci(n):", "The quick brown fox jumps over the lazy dog"]
N_PREDICT = 24


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"f32": MOE_SPEC, "q8_0": replace(MOE_SPEC, wtype="q8_0"),
            "q4_k": replace(MOE_SPEC, wtype="q4_k", n_embd=256, n_ff_exp=256, head_dim=64, seed=4)}


def write_spec(arch: str, name: str, spec: TinyModelSpec, out_dir: Path) -> Path:
    """out_dir/tiny-<arch>-<name>.gguf: one recorded model, on the built-in vocabulary."""
    path = out_dir / f"tiny-{arch}-{name}.gguf"
    write_tiny_model(path, spec, vocab="builtin")
    return path


def write_variant(name: str, out_dir: Path) -> Path:
    return write_spec("qwen3moe", name, variants()[name], out_dir)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def request(prompt) -> dict:
    return {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0.0, "top_k": 1, "seed": 1,
            "return_tokens": True, "cache_prompt": False, "ignore_eos": True}


def greedy(url: str, prompt) -> list[int]:
    import httpx

    r = httpx.post(url + "/completion", json=request(prompt), timeout=120)
    r.raise_for_status()
    return r.json()["tokens"]


# recorded configurations: extra llama-server arguments
CONFIGS = {"default": [], "f32attn": ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]}


def server_args(model: Path, config: str = "default") -> list[str]:
    return ["-m", str(model), "-c", "512", "-np", "1", "--no-warmup", "--cache-ram", "0", *CONFIGS[config]]


def record(server: str, model: Path, port: int, config: str) -> dict:
    import httpx

    proc = subprocess.Popen([server, *server_args(model, config), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout=120)
        text_ids = [httpx.post(url + "/tokenize", json={"content": p, "add_special": True}).json()["tokens"]
                    for p in TEXT_PROMPTS]
        return {"token_prompts": [greedy(url, p) for p in TOKEN_PROMPTS],
                "text_prompts": [greedy(url, p) for p in TEXT_PROMPTS], "text_prompt_ids": text_ids}
    finally:
        proc.terminate()
        proc.wait()


def record_main(doc: str, out_name: str, port: int, variants, write) -> int:
    """The command line of a recording script: --server, --out (default tests/data/OUT_NAME), --port;
    every variant (`variants()`: name -> spec) written by `write(name, dir)`, its sha256 and its
    tokens under both CONFIGS, into one JSON file."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data" / out_name))
    ap.add_argument("--port", type=int, default=port)
    a = ap.parse_args()
    out = {"reference": "llama-server b1-0c1e570", "command": " ".join(["python", *sys.argv]),
           "server_args": server_args(Path("MODEL")), "configs": CONFIGS, "request": request("PROMPT"),
           "token_prompts": TOKEN_PROMPTS, "text_prompts": TEXT_PROMPTS, "n_predict": N_PREDICT,
           "sha256": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as d:
        for name in variants():
            model = write(name, Path(d))
            out["sha256"][name] = sha256(model)
            out["tokens"][name] = {c: record(a.server, model, a.port, c) for c in CONFIGS}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


def main() -> int:
    return record_main(__doc__, "qwen3moe_greedy.json", 8260, variants, write_variant)


if __name__ == "__main__":
    sys.exit(main())

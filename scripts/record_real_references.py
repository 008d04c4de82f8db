#!/usr/bin/env python3
"""Record llama-server b1-0c1e570's greedy tokens and tokenizations on the two real models into
tests/data/real_models_reference.json (read by tests/test_real_models.py).

    python scripts/fetch_models.py
    python scripts/record_real_references.py --server /work/lsb/llama-server [--port 8218] [--out FILE]

The tokens depend on the float order of the CPU build llama.cpp runs (AVX-512 or AVX2): an
llama-server built without AVX-512 records tests/data/avx2/real_models_reference.json, which the tests
read on CPUs without AVX-512 (tests/llama_tokens.py `float_order`).

For each model (runtime/model/model_files.py, in the model cache): starts
`llama-server -m MODEL --port PORT -c 2048 -np 1 -t 2`, then one request at a time:
`POST /completion {"prompt": P, "n_predict": 32, "temperature": 0, "cache_prompt": false,
"return_tokens": true}` for the 8 prompts of PROMPTS (the generated token ids), and
`POST /tokenize {"content": T, "add_special": false, "parse_special": true}` for the texts of
TEXTS. The exact command lines land in the JSON beside the tokens.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from runtime.model.model_files import GEMMA, QWEN, cached_path  # noqa: E402

OUT = ROOT / "tests" / "data" / "real_models_reference.json"
N_PREDICT = 32
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "import numpy as np\n\n# compute the mean of a list of numbers\n",
    "Q: What is 12 times 7?\nA:",
    "The three primary colors are",
    "<html>\n<head>\n<title>",
    "Translate to French: Good morning, my friend. ->",
]
TEXTS = [
    "Hello world! This is a test of the tokenizer.",
    "def add(a, b):\n    return a + b  # sum\n\n\tindented\ttabs  and   spaces",
    "Ünïcödé: naïve café, Straße,日本語のテキスト, 한국어, emoji 🙂👍🏽, math ∑ x² ≤ ∞",
    "  leading spaces, trailing spaces   \n\n\nnewlines\r\nand CRLF",
    "numbers 1234567890 3.14159 -42 1e-10 0x1F and URLs https://example.com/a?b=c&d=e",
    "<|im_start|>user\nhi<|im_end|> <start_of_turn>model\n<end_of_turn><eos>",
    "JSON: {\"key\": [1, 2, {\"nested\": null}], \"ok\": true}",
    "Le renard brun rapide saute par-dessus le chien paresseux. ¿Qué tal? Привет, мир!",
]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("llama-server did not become ready")


def cpu_features() -> str:
    """The ISA llama.cpp's CPU backend picked its kernels by: its greedy tokens depend on it (on the real
    Qwen model, an AVX2 machine and an AVX-512 VNNI one differ on 4 of the 8 prompts)."""
    try:
        flags = next(ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512bw") if f in flags)


def record(server: str, model_path: Path, port: int) -> dict:
    cmd = [server, "-m", str(model_path), "--port", str(port), "-c", "2048", "-np", "1", "-t", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        completions, tokenized = [], []
        with httpx.Client(base_url=url, timeout=600) as c:
            for p in PROMPTS:
                body = {"prompt": p, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False,
                        "return_tokens": True}
                r = c.post("/completion", json=body).json()
                completions.append({"prompt": p, "tokens": r["tokens"], "content": r["content"]})
            for t in TEXTS:
                r = c.post("/tokenize", json={"content": t, "add_special": False, "parse_special": True}).json()
                tokenized.append({"text": t, "tokens": r["tokens"]})
            props = c.get("/props").json()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"server_command": " ".join(cmd[:1] + ["-m", model_path.name] + cmd[3:]),
            "request": {"n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False, "return_tokens": True},
            "build": props.get("build_info", ""), "completions": completions, "tokenize": tokenized}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--port", type=int, default=8218)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    data = {"recorded_with": "python scripts/record_real_references.py --server " + args.server,
            "cpu": cpu_features(), "models": {}}
    for key, m in ((m.key, m) for m in (QWEN, GEMMA)):
        path = cached_path(m)
        if path is None:
            print(f"{m.filename} not in the cache: run scripts/fetch_models.py first", file=sys.stderr)
            return 1
        print(f"recording {key} ...", flush=True)
        data["models"][key] = record(args.server, path, args.port)
    Path(args.out).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

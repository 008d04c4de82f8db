"""Records llama-server's greedy tokens with a LoRA adapter into tests/data/lora_greedy.json.

The model and the adapter are generated here, deterministically (`tiny_lora_files`), so that
tests/test_lora_server.py regenerates the very same files (their sha256 are recorded and checked)
and compares tritium's greedy tokens with llama-server's on them.

    python scripts/record_lora_reference.py --server /work/lsb/llama-server \\
        --vocab ../shared/vocab/ggml-vocab-qwen2.gguf --out tests/data/lora_greedy.json
    # or, with only the reference build's libllama: --via libllama (scripts/lora_greedy_ref.c)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from record_real_references import wait_ready  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["Hello, my name is", "The capital of France", "def fibonacci(n):"]
N_PREDICT = 12
# (request `lora` field or None, label): per-request scales over the server's adapters
SERVER_SCALES = [1.0, 0.25]
CASES = [("base", [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]),
         ("a0", [{"id": 0, "scale": 1.0}]),
         ("a0_half_a1", [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 1.0}]),
         ("server", None)]  # the server's scales: --lora a0 (1.0) --lora-scaled a1:0.25
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def tiny_lora_files(vocab: Path, out_dir: Path) -> tuple[Path, Path, Path]:
    """A tiny llama model on the given vocabulary and two adapters (rank 4 alpha 8 on every
    linear, and rank 2 without alpha on layer 1's attention)."""
    from runtime.model.lora import write_lora
    from runtime.model.tiny_model import spec_with, tensor_shapes, write_tiny_model

    spec = spec_with(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=512, name="lora-tiny", seed=21)
    model = out_dir / "lora-tiny.gguf"
    write_tiny_model(model, spec, vocab=vocab)
    shapes = {n: s for n, s in tensor_shapes(spec, 1) if len(s) == 2}  # [rows, cols] (vocab-free ones used)
    adapters = []
    for k, (rank, alpha, names) in enumerate([
            (4, 8.0, [f"blk.{i}.{t}.weight" for i in range(2) for t in TARGETS]),
            (2, 0.0, ["blk.1.attn_q.weight", "blk.1.attn_v.weight", "blk.1.attn_output.weight"])]):
        rng = np.random.default_rng(100 + k)
        weights = {}
        for n in names:
            rows, cols = shapes[n]
            weights[n] = (rng.normal(0, 0.5, (rank, cols)).astype(np.float32),
                          rng.normal(0, 0.5, (rows, rank)).astype(np.float32))
        path = out_dir / f"lora-tiny-adapter{k}.gguf"
        write_lora(path, spec.arch, weights, alpha)
        adapters.append(path)
    return model, adapters[0], adapters[1]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def greedy(url: str, prompt: str, lora) -> list[int]:
    import httpx

    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0.0, "top_k": 1, "seed": 1,
            "return_tokens": True, "cache_prompt": False, "ignore_eos": True}
    if lora is not None:
        body["lora"] = lora
    r = httpx.post(url + "/completion", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["tokens"]


def server_args(model: Path, a0: Path, a1: Path) -> list[str]:
    return ["-m", str(model), "--lora", str(a0), "--lora-scaled", f"{a1}:0.25", "-c", "1024", "-np", "1",
            "--no-warmup", "--cache-ram", "0"]


def record_all(url: str) -> dict:
    return {label: [greedy(url, p, lora) for p in PROMPTS] for label, lora in CASES}


def record_libllama(model: Path, a0: Path, a1: Path, work: Path) -> dict:
    """The same greedy tokens from the reference build's libllama (scripts/lora_greedy_ref.c):
    for when the llama-server binary is not built yet; same library, same computation."""
    import os

    src = Path(__file__).resolve().parents[1] / "scripts" / "lora_greedy_ref.c"
    root = Path(os.environ.get("LLAMA_CPP", "/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    exe = work / "lora_greedy_ref"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), f"-I{root}/include", f"-I{root}/ggml/include",
                    f"-L{root}/build/bin", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{root}/build/bin"],
                   check=True)
    (work / "prompts.txt").write_text("".join(p + "\n" for p in PROMPTS))
    cases = []
    for _, lora in CASES:
        scales = SERVER_SCALES if lora is None else [next((e["scale"] for e in lora if e["id"] == i), 0.0)
                                                     for i in range(2)]
        cases.append(",".join(str(s) for s in scales))
    out = subprocess.run([str(exe), str(model), str(N_PREDICT), str(work / "prompts.txt"), *cases], check=True,
                         capture_output=True, text=True, env=dict(os.environ, LORA_ADAPTERS=f"{a0},{a1}")).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    n = len(PROMPTS)
    return {label: rows[i * n:(i + 1) * n] for i, (label, _) in enumerate(CASES)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--vocab", default=str(Path(__file__).resolve().parents[2] / "shared/vocab/ggml-vocab-qwen2.gguf"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/lora_greedy.json"))
    ap.add_argument("--port", type=int, default=8250)
    ap.add_argument("--via", choices=("server", "libllama"), default="server",
                    help="llama-server's /completion, or the same build's libllama (scripts/lora_greedy_ref.c)")
    a = ap.parse_args()
    import httpx

    with tempfile.TemporaryDirectory() as d:
        model, a0, a1 = tiny_lora_files(Path(a.vocab), Path(d))
        if a.via == "libllama":
            out = {"reference": "libllama of llama.cpp b1-0c1e570 (scripts/lora_greedy_ref.c)",
                   "command": " ".join(sys.argv),
                   "sha256": {"model": sha256(model), "adapter0": sha256(a0), "adapter1": sha256(a1)},
                   "prompts": PROMPTS, "n_predict": N_PREDICT, "cases": dict(CASES),
                   "lora_adapters_scales": SERVER_SCALES, "tokens": record_libllama(model, a0, a1, Path(d))}
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
            print(f"wrote {a.out}")
            return 0
        proc = subprocess.Popen([a.server, *server_args(model, a0, a1), "--port", str(a.port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{a.port}"
        try:
            wait_ready(url, proc, timeout=120)
            adapters = httpx.get(url + "/lora-adapters").json()
            tokens = record_all(url)
        finally:
            proc.terminate()
            proc.wait()
        out = {"reference": "llama-server b1-0c1e570", "command": " ".join(sys.argv),
               "sha256": {"model": sha256(model), "adapter0": sha256(a0), "adapter1": sha256(a1)},
               "prompts": PROMPTS, "n_predict": N_PREDICT, "cases": dict(CASES),
               "lora_adapters_scales": [x["scale"] for x in adapters], "tokens": tokens}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

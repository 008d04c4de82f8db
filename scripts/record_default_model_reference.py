#!/usr/bin/env python3
"""Record llama-server b1-0c1e570 on the default model, SmolLM2-135M-Instruct Q4_1, into
tests/data/<float order>/smollm2_reference.json (read by tests/test_default_model.py).

    python scripts/fetch_models.py --only smollm2-135m-instruct
    python scripts/record_default_model_reference.py --server /work/lsb/llama-server --out tests/data/avx2/smollm2_reference.json

Starts `llama-server -m smollm2-135m-instruct-q4_1.gguf --port PORT -c 2048 -np 1 -t 2`, then one
request at a time: a newcomer's first chat, `POST /v1/chat/completions {"messages": [{"role":
"user", "content": CHAT}], "temperature": 0, "max_tokens": 200}` (the answer's text), `POST
/apply-template` of the same messages (the prompt its template makes) and `POST /completion` of
that prompt with `"n_predict": 200, "temperature": 0, "cache_prompt": false, "return_tokens": true`
(the answer's token ids); and the 8 greedy completions and 8 tokenizations of
scripts/record_real_references.py. The greedy tokens depend on the float order llama.cpp was built
for: this machine's (an AVX2-only CPU: the AVX2 recording; the AVX-512 one is not recorded).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from record_real_references import cpu_features, record, wait_ready  # noqa: E402
from runtime.model.model_files import SMOLLM2, cached_path  # noqa: E402

CHAT = "write a Python function that reverses a string"
N_CHAT = 200


def record_chat(server: str, model_path: Path, port: int) -> dict:
    cmd = [server, "-m", str(model_path), "--port", str(port), "-c", "2048", "-np", "1", "-t", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    messages = [{"role": "user", "content": CHAT}]
    try:
        wait_ready(url, proc)
        with httpx.Client(base_url=url, timeout=600) as c:
            chat = c.post("/v1/chat/completions", json={"messages": messages, "temperature": 0,
                                                         "max_tokens": N_CHAT}).json()
            prompt = c.post("/apply-template", json={"messages": messages}).json()["prompt"]
            comp = c.post("/completion", json={"prompt": prompt, "n_predict": N_CHAT, "temperature": 0,
                                               "cache_prompt": False, "return_tokens": True}).json()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"messages": messages, "max_tokens": N_CHAT, "content": chat["choices"][0]["message"]["content"],
            "finish_reason": chat["choices"][0]["finish_reason"], "prompt": prompt, "tokens": comp["tokens"],
            "completion_content": comp["content"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--port", type=int, default=8219)
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "avx2" / "smollm2_reference.json"))
    args = ap.parse_args()
    path = cached_path(SMOLLM2)
    if path is None:
        print(f"{SMOLLM2.filename} not in the cache: run scripts/fetch_models.py first", file=sys.stderr)
        return 1
    data = {"recorded_with": f"python scripts/record_default_model_reference.py --server {args.server}",
            "cpu": cpu_features(), "model": SMOLLM2.key, "sha256": SMOLLM2.digest,
            "chat": record_chat(args.server, path, args.port)}
    data.update(record(args.server, path, args.port))
    Path(args.out).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {data['chat']['content'][:200]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

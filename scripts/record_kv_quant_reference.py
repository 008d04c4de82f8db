#!/usr/bin/env python3
"""Record llama-server b1-0c1e570 on the real Qwen model with quantized KV caches (-ctk / -ctv):
greedy tokens per cache-type pair, and the mean log-probability of a fixed text (each of its tokens
given the ones before, from /completion's n_probs) with f16 and with q8_0 caches. Read by
tests/test_kv_quant_server.py.

    python scripts/fetch_models.py
    python scripts/record_kv_quant_reference.py --server /work/lsb/llama-server [--port 8231]

For each pair of CONFIGS: `llama-server -m QWEN -c 2048 -np 1 -t 2 -ctk K -ctv V --port PORT`, then
`POST /completion {"prompt": P, "n_predict": 24, "temperature": 0, "cache_prompt": false,
"return_tokens": true}` for each of PROMPTS, and for the text TEXT (tokenized once by /tokenize):
`POST /completion {"prompt": ids[:k], "n_predict": 1, "n_probs": 40, "temperature": 0,
"cache_prompt": true}` for k = 1 .. len(ids) - 1, the log-probability of ids[k] among the top 40
(absent: recorded as null), for the pairs of LOGPROB_CONFIGS. The tokens depend on the float order of llama.cpp's CPU build: written
where tests.llama_tokens.reference_file looks for this machine's order (tests/data/avx2/ on AVX2).
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
from runtime.model.model_files import QWEN, cached_path  # noqa: E402
from scripts.record_real_references import cpu_features, wait_ready  # noqa: E402

N_PREDICT = 24
N_PROBS = 40
CONFIGS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q5_1", "q5_1"), ("iq4_nl", "iq4_nl"), ("q8_0", "f16")]
LOGPROB_CONFIGS = {("f16", "f16"), ("q8_0", "q8_0")}  # the text's log-probabilities: f16 against q8_0
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "Q: What is 12 times 7?\nA:",
]
TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined movable metal type, oil-based ink and a wooden press.")


def server_args(server: str, model: Path, port: int, k: str, v: str) -> list[str]:
    return [server, "-m", str(model), "--port", str(port), "-c", "2048", "-np", "1", "-t", "2", "-ctk", k, "-ctv", v]


def text_logprobs(url: str, ids: list[int]) -> list[float | None]:
    out: list[float | None] = []
    with httpx.Client(timeout=120) as c:
        for k in range(1, len(ids)):
            r = c.post(url + "/completion", json={"prompt": ids[:k], "n_predict": 1, "n_probs": N_PROBS,
                                                  "temperature": 0, "cache_prompt": True})
            r.raise_for_status()
            top = r.json()["completion_probabilities"][0]["top_logprobs"]
            out.append(next((t["logprob"] for t in top if t["id"] == ids[k]), None))
    return out


def main() -> int:
    from tests.llama_tokens import float_order

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--port", type=int, default=8231)
    a = ap.parse_args()
    model = cached_path(QWEN)
    if model is None:
        raise SystemExit("the Qwen model is not in the model cache: python scripts/fetch_models.py")
    url = f"http://127.0.0.1:{a.port}"
    rec: dict = {"model": QWEN.filename, "cpu": cpu_features(), "n_predict": N_PREDICT, "n_probs": N_PROBS,
                 "prompts": PROMPTS, "text": TEXT, "configs": {}}
    for k, v in CONFIGS:
        cmd = server_args(a.server, model, a.port, k, v)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(url, proc)
            greedy = []
            for p in PROMPTS:
                r = httpx.post(url + "/completion", json={"prompt": p, "n_predict": N_PREDICT, "temperature": 0,
                                                          "cache_prompt": False, "return_tokens": True}, timeout=300)
                r.raise_for_status()
                greedy.append(r.json()["tokens"])
            ids = httpx.post(url + "/tokenize", json={"content": TEXT, "add_special": False}).json()["tokens"]
            lps = text_logprobs(url, ids) if (k, v) in LOGPROB_CONFIGS else []
        finally:
            proc.terminate()
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        entry = {"command": " ".join(cmd[1:]), "greedy": greedy}
        if lps:
            entry.update(text_ids=ids, text_logprobs=lps)
        rec["configs"][f"{k}/{v}"] = entry
        print(k, v, "text log-probabilities:", len([x for x in lps if x is not None]), "of", len(lps), "in the top",
              N_PROBS, flush=True)
    order = float_order()
    dest = ROOT / "tests" / "data" / ("" if order == "avx512" else order) / "kv_quant_qwen.json"
    dest.write_text(json.dumps(rec, indent=1) + "\n")
    print("wrote", dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

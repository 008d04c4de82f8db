"""Records llama-server's `/rerank` answers on the tiny generated reranker into
tests/data/rerank_reference.json; tests/test_rerank.py regenerates the same file (its sha256 is
recorded and checked) and compares tritium's scores, order and usage with these.

The model: runtime.model.tiny_model.RERANK_SPEC on the built-in vocabulary (qwen3 with a
Qwen3-Reranker's `cls.output` yes/no head, RANK pooling, `tokenizer.chat_template.rerank`).

    python scripts/record_rerank_reference.py --server /work/lsb/llama-server --out tests/data/rerank_reference.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DOCS = ["A machine is a physical system that uses power to apply forces.",
        "Learning is the process of acquiring new understanding.",
        "Machine learning is a field of study in artificial intelligence.",
        "Paris, capitale de la France, est une grande ville européenne."]
CASES = [
    ("/rerank", {"query": "Machine learning is", "documents": DOCS}),
    ("/v1/rerank", {"query": "Which city?", "documents": DOCS, "top_n": 2}),
    ("/reranking", {"query": "Machine learning is", "texts": DOCS, "return_text": True}),
    ("/v1/reranking", {"query": "", "documents": ["", "x"]}),
    ("/rerank", {"query": "q", "documents": [{"text": "a"}]}),
    ("/rerank", {"query": "q", "documents": ["a", "b"], "top_n": -1}),
    ("/rerank", {"query": "q", "texts": ["a", "b"], "top_n": "2", "return_text": 1}),
]


def post(url: str, body: dict) -> tuple[int, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def run(server: str, model: Path, port: int, cases: list) -> list[dict]:
    proc = subprocess.Popen([server, "-m", str(model), "--rerank", "-c", "1024", "-np", "1", "--port", str(port),
                             "--no-webui"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        out = []
        for path, body in cases:
            status, resp = post(base + path, body)
            out.append({"path": path, "request": body, "status": status, "response": resp})
        return out
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    from runtime.model.tiny_model import RERANK_SPEC, spec_with, write_tiny_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="llama-server b1-0c1e570")
    ap.add_argument("--out", default="tests/data/rerank_reference.json")
    ap.add_argument("--port", type=int, default=18731)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = write_tiny_model(Path(d) / "tiny-reranker.gguf", RERANK_SPEC, vocab="builtin")
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        cases = run(a.server, model, a.port, CASES)
        # a model without a classification head (llama): llama.cpp's score is the first value of the
        # last token's normed state; tests/conftest.py's api_engine model
        plain = write_tiny_model(Path(d) / "api-tiny.gguf", spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2,
                                                                       n_ff=128, n_ctx=512, name="api-tiny", seed=7),
                                 vocab="builtin")
        headless = run(a.server, plain, a.port, CASES[:1])
        sha_plain = hashlib.sha256(plain.read_bytes()).hexdigest()
    out = {"server": "llama-server b1-0c1e570", "args": "-m MODEL --rerank -c 1024 -np 1",
           "model": "runtime.model.tiny_model.RERANK_SPEC, builtin vocabulary", "model_sha256": sha, "cases": cases,
           "headless_model_sha256": sha_plain, "headless_cases": headless}
    Path(a.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())

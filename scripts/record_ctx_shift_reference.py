#!/usr/bin/env python3
"""Records llama-server's context shift (`--context-shift`) on the built-in tiny model into
tests/data/avx2/ctx_shift_reference.json; tests/test_context_shift.py regenerates the same model
(its sha256 is recorded and checked), starts tritium with the same flags and compares the greedy
tokens, `truncated`, `predicted_n` and the shifts the server logged (n_keep, n_left, n_discard).

The model: runtime.model.tiny_model.BUILTIN_SPEC (what tritium serves without -m). The slot holds
256 tokens (-c 256 -np 1: llama.cpp pads n_ctx to 256, so the same on both), the requests generate
past it several times, with the default n_keep / n_discard, with n_keep -1 and a fixed n_discard,
and with n_keep 4. The recording is of llama.cpp's AVX2 float order (the reference binary's
build); greedy tokens of a random model depend on it.

    python scripts/record_ctx_shift_reference.py --server /work/lsb/llama-server \\
        --out tests/data/avx2/ctx_shift_reference.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FLAGS = ["-c", "256", "-np", "1", "--context-shift"]
CASES = [
    {"prompt": list(range(1, 11)), "n_predict": 600},
    {"prompt": list(range(5, 25)), "n_predict": 500, "n_keep": -1, "n_discard": 50},
    {"prompt": list(range(1, 11)), "n_predict": 400, "n_keep": 4},
]
COMMON = {"return_tokens": True, "cache_prompt": False, "temperature": 0}
SHIFT = re.compile(r"slot context shift, n_keep = (\d+), n_left = (\d+), n_discard = (\d+)")


def write_model(out_dir: Path) -> Path:
    from runtime.model.tiny_model import BUILTIN_SPEC, write_tiny_model

    path = out_dir / "tritium-builtin-tiny-f32.gguf"
    write_tiny_model(path, BUILTIN_SPEC, vocab="builtin")
    return path


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def run_cases(url: str, log_path: Path) -> list[dict]:
    """Each case's answer and the shifts logged while it ran."""
    out = []
    for case in CASES:
        seen = len(SHIFT.findall(log_path.read_text(errors="replace")))
        d = post(url + "/completion", {**case, **COMMON})
        time.sleep(0.2)
        shifts = [list(map(int, m)) for m in SHIFT.findall(log_path.read_text(errors="replace"))[seen:]]
        out.append({"request": case, "tokens": d.get("tokens"), "truncated": d.get("truncated"),
                    "predicted_n": d.get("timings", {}).get("predicted_n"), "shifts": shifts})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests" / "data" / "avx2"
                                         / "ctx_shift_reference.json"))
    ap.add_argument("--port", type=int, default=8671)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = write_model(Path(d))
        log_path = Path(d) / "server.log"
        cmd = [args.server, "-m", str(model), "--port", str(args.port), *FLAGS]
        with open(log_path, "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{args.port}"
            for _ in range(600):
                try:
                    if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            cases = run_cases(url, log_path)
        finally:
            p.terminate()
            p.wait()
        rec = {"command": " ".join(["llama-server", "-m", "MODEL", *FLAGS]), "server": "llama.cpp b1-0c1e570 (AVX2)",
               "request_fields": COMMON, "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "cases": cases}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {args.out}: " + ", ".join(f"{len(c['tokens'] or [])} tokens, {len(c['shifts'])} shifts" for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())

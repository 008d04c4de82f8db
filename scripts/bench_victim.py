#!/usr/bin/env python3
"""A victim stream's cost per token beside one request with request-sized parameters, tritium and
llama-server on the same GGUF file in the same run.

    python scripts/bench_victim.py [--llama /work/lsb/llama-server] [--model F.gguf] [--tokens 96]

Each server is started alone (`-np 2 -c 8192`, ports --port and --port + 1). The victim is a
greedy stream in slot 0 (`n_predict` --tokens, ignore_eos); its ms/token is the server's own
`timings.predicted_per_token_ms`. It runs once alone, then beside each offender, which generates
in slot 1 for as long as the victim runs (a stream the client closes afterwards: the server
cancels it). Offenders: a plain request (what any second stream costs), 100,000 logit_bias entries, 200,000 stop strings, 50,000 `samplers`
entries, DRY over the whole context, 200,000 DRY sequence breakers, n_probs 100, a 5,000-alternative grammar. One line per server and offender: victim ms/token beside it,
alone, and the ratio; then the table of ratios side by side. Without --model a tiny random model
is generated (the built-in vocabulary).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
LLAMA = "/work/lsb/llama-server"
VICTIM_TIMEOUT_S = 120  # a victim that takes longer is reported stalled (the server is restarted)


def offenders(n_vocab: int) -> dict[str, dict]:
    rng = random.Random(5)
    words = ["".join(rng.choice("qwxzjkvb") for _ in range(rng.randint(6, 12))) for _ in range(200_000)]
    return {
        "plain (baseline: any second stream)": {},
        "logit_bias 100k": {"logit_bias": [[i % n_vocab, 0.001] for i in range(100_000)]},
        "stop 200k": {"stop": words},
        "samplers 50k": {"samplers": ["top_k", "top_p", "min_p"] * 16_667},
        "dry whole context": {"dry_multiplier": 0.8, "dry_penalty_last_n": 8192, "dry_allowed_length": 1,
                              "repeat_penalty": 1.1, "repeat_last_n": 8192},
        "dry breakers 200k": {"dry_multiplier": 0.8, "dry_sequence_breakers": [chr(33 + i % 90) + w for i, w in
                                                                            enumerate(words)]},
        "n_probs 100": {"n_probs": 100},
        "grammar 5k alternatives": {"grammar": "root ::= (" + " | ".join(f'"{w}"' for w in words[:5000]) + ")+"},
    }


def start(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(cmd + ["--port", str(port), "-np", "2", "-c", "8192"], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise SystemExit("server did not start")


def victim(url: str, n: int) -> float:
    body = {"prompt": "The victim counts: one two three", "n_predict": n, "temperature": 0, "ignore_eos": True,
            "id_slot": 0, "cache_prompt": False}
    r = httpx.post(url + "/completion", json=body, timeout=VICTIM_TIMEOUT_S)
    r.raise_for_status()
    return r.json()["timings"]["predicted_per_token_ms"]


def beside(url: str, extra: dict, n: int) -> tuple[float, str]:
    """The victim's ms/token while `extra` generates in slot 1 (started first, closed after)."""
    body = {"prompt": "an offender", "n_predict": 100_000, "temperature": 1.0, "ignore_eos": True, "id_slot": 1,
            "stream": True, **extra}
    status = {"s": "?"}
    stop = threading.Event()

    def run():
        try:
            with httpx.Client(timeout=600) as c, c.stream("POST", url + "/completion", json=body) as r:
                status["s"] = str(r.status_code)
                for _ in r.iter_lines():
                    if stop.is_set():
                        break
        except httpx.HTTPError as e:
            status["s"] = type(e).__name__
    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the offender is generating
        slots = httpx.get(url + "/slots", timeout=30).json()
        if any(s.get("id") == 1 and s.get("is_processing") for s in slots) or not t.is_alive():
            break
        time.sleep(0.1)
    time.sleep(0.5)
    try:
        return victim(url, n), status["s"]
    finally:
        stop.set()
        t.join(30)
        time.sleep(0.5)


def measure(name: str, cmd: list[str], port: int, n: int, n_vocab: int, reps: int) -> dict[str, tuple[float, float]]:
    url = f"http://127.0.0.1:{port}"
    cmd = cmd + ["--slots"] if "llama" in name else cmd
    with tempfile.TemporaryDirectory() as d:
        proc = start(cmd, port, Path(d) / "log.txt")
        try:
            victim(url, 8)  # warm-up
            alone = min(victim(url, n) for _ in range(reps))
            out = {}
            for label, extra in offenders(n_vocab).items():
                try:
                    ms, st = min((beside(url, extra, n) for _ in range(reps)), key=lambda x: x[0])
                except httpx.HTTPError as e:  # the victim stalled beside it: a fresh server for the next
                    ms, st = float("inf"), f"victim {type(e).__name__}"
                    stop_server(proc)
                    proc = start(cmd, port, Path(d) / "log.txt")
                out[label] = (ms, alone)
                print(json.dumps({"server": name, "offender": label, "offender_status": st, "victim_ms_per_token": round(ms, 3),
                                  "alone_ms_per_token": round(alone, 3), "ratio": round(ms / alone, 2)}), flush=True)
            return out
        finally:
            stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:  # llama-server stuck in a request does not exit on SIGTERM
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama", default=LLAMA)
    ap.add_argument("--tritium", default=str(REPO / ".venv" / "bin" / "tritium-server"))
    ap.add_argument("--model", default="")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--port", type=int, default=8360)
    a = ap.parse_args()
    # SIGTERM runs the finally blocks: the servers (own sessions) are stopped, not left generating
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model = a.model
    if not model:
        sys.path.insert(0, str(REPO))
        from runtime.model.tiny_model import spec_with, write_tiny_model
        model = str(Path(tempfile.gettempdir()) / "bench-victim-tiny.gguf")
        write_tiny_model(model, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=8192,
                                          name="victim-tiny", seed=7), vocab="builtin")
    sys.path.insert(0, str(REPO))
    from runtime.model.gguf import read_gguf  # noqa: PLC0415
    n_vocab = len(read_gguf(model, with_tensors=False).metadata["tokenizer.ggml.tokens"])
    res = {"tritium": measure("tritium", [a.tritium, "-m", model], a.port, a.tokens, n_vocab, a.reps)}
    if a.llama and Path(a.llama).exists():
        res["llama-server"] = measure("llama-server", [a.llama, "-m", model], a.port + 1, a.tokens, n_vocab, a.reps)
    # per server: beside / alone, and beside / beside a plain second stream (what batching costs)
    print("\n| offender | " + " | ".join(f"{k} beside / alone (ms/token) | {k} vs plain" for k in res) + " |",
          file=sys.stderr)
    print("|---|" + "---|---|" * len(res), file=sys.stderr)
    plain = next(iter(offenders(n_vocab)))
    for label in offenders(n_vocab):
        cells = [f"{res[k][label][0]:.2f} / {res[k][label][1]:.2f} = {res[k][label][0] / res[k][label][1]:.2f}x | "
                 f"{res[k][label][0] / res[k][plain][0]:.2f}x" for k in res]
        print(f"| {label} | " + " | ".join(cells) + " |", file=sys.stderr)


if __name__ == "__main__":
    main()

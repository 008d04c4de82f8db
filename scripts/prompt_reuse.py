#!/usr/bin/env python3
"""Prompt reuse across the turns of a chat: the prompt tokens each server evaluates per turn
(`timings.prompt_n`; the rest comes from the slot's cache: KV, sliding-window blocks, context
checkpoints, recurrent state), tritium against llama-server b1-0c1e570 on the same file and the
same conversation, and whether both answered the same.

One slot, the servers' default cache settings, greedy sampling; a conversation of `--turns` user
messages, each answer appended as the assistant's message before the next question (the chat
template re-renders the whole conversation every turn). Prints a Markdown table (docs/benchmarks.md).

    python scripts/prompt_reuse.py --model tiny-qwen35-f32.gguf --model tiny-gemma3.gguf
    (with no --model: the tiny qwen35 of scripts/record_qwen35_reference.py and the tiny Gemma 3 of
    tests/test_gemma3_tiny.py, written to a temporary directory)

    python scripts/prompt_reuse.py --record tests/data/gemma3_prompt_reuse.json
    (llama-server alone on the tiny Gemma 3, its turns written for tests/test_prompt_reuse.py)
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

QUESTIONS = ["Hello! Who are you?", "Tell me about the weather today.", "Write a short poem about the sea.",
             "Now summarize our conversation.", "Thanks, one more question: what is 2 + 2?",
             "And what about 3 + 5?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], log: Path, env: dict) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    p = subprocess.Popen(cmd + ["--port", str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                         cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1500):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    p.terminate()
    raise SystemExit(f"server did not start: {log.read_text()[-2000:]}")


def conversation(url: str, turns: int, max_tokens: int) -> list[tuple[int, int, str]]:
    """(prompt tokens of the turn, prompt tokens evaluated, answer) per turn."""
    messages, out = [], []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens,
                                                           "temperature": 0.0, "top_k": 1, "seed": 1},
                       timeout=600)
        r.raise_for_status()
        j = r.json()
        answer = j["choices"][0]["message"].get("content") or ""
        out.append((j["usage"]["prompt_tokens"], j["timings"]["prompt_n"], answer))
        messages.append({"role": "assistant", "content": answer})
    return out


def default_models(d: Path) -> list[Path]:
    import record_qwen35_reference as q35
    from runtime.model.tiny_model import GEMMA3_SPEC, write_tiny_model

    g3 = d / "tiny-random-gemma3.gguf"
    write_tiny_model(g3, GEMMA3_SPEC, vocab="builtin")
    return [q35.write_variant("f32", d), g3]


def server_args(model: Path, ctx: int) -> list[str]:
    return ["-m", str(model), "-c", str(ctx), "-np", "1"]


def record(a, work: Path) -> int:
    import hashlib
    import json

    from runtime.model.tiny_model import GEMMA3_SPEC, write_tiny_model

    g3 = work / "tiny-random-gemma3.gguf"
    write_tiny_model(g3, GEMMA3_SPEC, vocab="builtin")
    p, url = _start([a.server] + server_args(g3, a.ctx), work / "llama-server.log", dict(os.environ))
    try:
        turns = conversation(url, a.turns, a.max_tokens)
    finally:
        p.terminate()
        p.wait()
    out = {"reference": "llama-server b1-0c1e570", "command": " ".join(["python", *sys.argv]),
           "sha256": hashlib.sha256(g3.read_bytes()).hexdigest(), "server_args": server_args(Path("MODEL"), a.ctx),
           "questions": QUESTIONS[:a.turns], "max_tokens": a.max_tokens,
           "turns": [{"prompt_tokens": t[0], "prompt_n": t[1], "answer": t[2]} for t in turns]}
    Path(a.record).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", a.record)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--tritium", default=f"{sys.executable} -m api.cli")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--record", help="write llama-server's turns on the tiny Gemma 3 to this JSON file and stop")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    if a.record:
        return record(a, work)
    models = [Path(m) for m in a.model] or default_models(work)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    print("| model | turn | prompt tokens | llama-server evaluated | tritium evaluated | same answer |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m in models:
        runs = {}
        for name, cmd in (("llama-server", [a.server]), ("tritium", a.tritium.split())):
            p, url = _start(cmd + server_args(m, a.ctx), work / f"{name}.log", env)
            try:
                runs[name] = conversation(url, a.turns, a.max_tokens)
            finally:
                p.terminate()
                p.wait()
        for i, (ref, own) in enumerate(zip(runs["llama-server"], runs["tritium"])):
            print(f"| {m.name} | {i + 1} | {ref[0]} | {ref[1]} | {own[1]} | {'yes' if ref[2] == own[2] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

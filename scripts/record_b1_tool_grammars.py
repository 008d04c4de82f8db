#!/usr/bin/env python3
"""Record llama-server b1-0c1e570's tool-call grammars for the Qwen2.5 (Hermes) template into
tests/data/b1_hermes_grammars.json (read by tests/test_chat_tool_grammar.py).

    python scripts/record_b1_tool_grammars.py --server /work/lsb/llama-server [--port 8219]

Starts `llama-server -m MODEL --port PORT -np 1 -c 2048 --jinja --chat-template-file
../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja` on a tiny generated model (the grammar does not
depend on the weights), sends one chat request per case of CASES with `"verbose": true` and
`max_tokens` 1, and keeps each request's tools, tool_choice, parallel_tool_calls and the
`generation_settings` grammar, grammar_lazy and grammar_triggers it echoes.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from record_real_references import wait_ready  # noqa: E402
OUT = ROOT / "tests" / "data" / "b1_hermes_grammars.json"
SHARED = ROOT.parent / "shared"


def fn(name: str, params: dict | None) -> dict:
    f: dict = {"name": name, "description": name}
    if params is not None:
        f["parameters"] = params
    return {"type": "function", "function": f}


WEATHER = fn("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
JOKE = fn("get_random_joke", {"type": "object", "properties": {}})
PING = fn("ping", None)
CALC = fn("calc.eval$x", {"type": "object", "properties": {"expr": {"type": "string"}, "prec": {"type": "integer"}}})
SEARCH = fn("search_products", {"type": "object", "properties": {
    "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
    "category": {"type": "string", "enum": ["books", "electronics", "toys"]}, "in_stock": {"type": "boolean"}},
    "required": ["query"]})
EMAIL = fn("send_email", {"type": "object", "properties": {
    "to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"},
    "options": {"type": "object", "properties": {"cc": {"type": "string"}, "priority": {"type": "number"}}}},
    "required": ["to", "subject"]})
CASES = [  # name, tools, tool_choice, parallel_tool_calls (None: the template's default, parallel)
    ("one-required", [WEATHER], "required", None),
    ("two-required-parallel", [WEATHER, JOKE], "required", True),
    ("two-required-single", [WEATHER, JOKE], "required", False),
    ("two-auto-parallel", [WEATHER, JOKE], "auto", True),
    ("one-auto-single", [WEATHER], "auto", False),
    ("no-parameters-and-odd-names", [PING, CALC], "required", True),
    ("nested-schemas", [SEARCH, EMAIL], "required", None),
    ("nested-schemas-auto", [SEARCH, EMAIL], "auto", None),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="the llama-server binary of scripts/build_llama_server.sh")
    ap.add_argument("--port", type=int, default=8219)
    args = ap.parse_args()
    from runtime.model.tiny_model import TinyModelSpec, write_tiny_model

    template = SHARED / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "tiny.gguf"
        write_tiny_model(model, TinyModelSpec(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128),
                         vocab=SHARED / "vocab" / "ggml-vocab-qwen2.gguf")
        cmd = [args.server, "-m", str(model), "--port", str(args.port), "-np", "1", "-c", "2048", "--jinja",
               "--chat-template-file", str(template)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{args.port}"
        try:
            wait_ready(url, proc)
            cases = []
            for name, tools, choice, parallel in CASES:
                body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": choice,
                        "max_tokens": 1, "verbose": True}
                if parallel is not None:
                    body["parallel_tool_calls"] = parallel
                gs = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["__verbose"][
                    "generation_settings"]
                cases.append({"name": name, "tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel,
                              "grammar": gs["grammar"], "grammar_lazy": gs["grammar_lazy"],
                              "grammar_triggers": gs["grammar_triggers"]})
        finally:
            proc.terminate()
            proc.wait()
    cmd[2] = "tiny.gguf (runtime.model.tiny_model.TinyModelSpec(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128), " \
             "ggml-vocab-qwen2.gguf)"
    cmd[-1] = "../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    OUT.write_text(json.dumps({"recorded_with": "python scripts/record_b1_tool_grammars.py --server BIN",
                               "server_command": " ".join(cmd[1:]), "build": "b1-0c1e570", "cases": cases},
                              indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} grammars to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

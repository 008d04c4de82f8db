#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random gemma4 models into
tests/data/gemma4_greedy.json (tests/test_gemma4.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.GEMMA4_SPEC,
E2B-like, in F32 and Q8_0; and "dense-f32", 31B-like: no per-layer inputs, no KV sharing, no
double-wide FFN, no `final_logit_softcapping` key so that llama.cpp's default cap of 30 applies),
so that the tests regenerate the very same files (their sha256 are recorded and checked) without
the reference binary. Their sliding window (8) is shorter than every sequence but one. Prompts,
request and the two recorded configurations are those of scripts/record_moe_reference.py. Also
recorded: llama-server's /apply-template with llama.cpp's models/templates/google-gemma-4-31B-it.jinja
(tests/data/templates/, `--jinja --chat-template-file`) on the conversations of `TEMPLATE_CASES`.

    python scripts/record_gemma4_reference.py --server /work/lsb/llama-server
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from runtime.model.tiny_model import GEMMA4_SPEC, TinyModelSpec  # noqa: E402
from record_real_references import wait_ready  # noqa: E402


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"f32": GEMMA4_SPEC, "q8_0": replace(GEMMA4_SPEC, wtype="q8_0"),
            "dense-f32": replace(GEMMA4_SPEC, n_embd_per_layer=0, gemma4_shared_kv=0, gemma4_double_mlp=False,
                                 final_softcap=0.0, seed=32)}


def write_variant(name: str, out_dir: Path) -> Path:
    return moe_ref.write_spec("gemma4", name, variants()[name], out_dir)


TEMPLATE = Path(__file__).resolve().parents[1] / "tests" / "data" / "templates" / "google-gemma-4-31B-it.jinja"
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]
TEMPLATE_CASES = [
    {"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"},
                  {"role": "user", "content": "How are you?"}]},
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello"}]},
    {"messages": [{"role": "user", "content": "Hello"}], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Show me pom.xml"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"type": "function", "id": "call00001",
                       "function": {"name": "read_file", "arguments": "{\"path\": \"pom.xml\"}"}}]},
                  {"role": "tool", "tool_call_id": "call00001", "content": "<project/>"}], "tools": TOOLS},
]


def record_template(server: str, model: Path, port: int) -> list[dict]:
    import httpx

    proc = subprocess.Popen([server, *moe_ref.server_args(model), "--port", str(port), "--jinja",
                             "--chat-template-file", str(TEMPLATE)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout=120)
        out = []
        for case in TEMPLATE_CASES:
            r = httpx.post(url + "/apply-template", json=case, timeout=60)
            r.raise_for_status()
            out.append({"request": case, "prompt": r.json()["prompt"]})
        return out
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    rc = moe_ref.record_main(__doc__, "gemma4_greedy.json", 8740, variants, write_variant)
    out = Path(__file__).resolve().parents[1] / "tests" / "data" / "gemma4_greedy.json"
    server = sys.argv[sys.argv.index("--server") + 1] if "--server" in sys.argv else "/work/lsb/llama-server"
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        rec = json.loads(out.read_text())
        rec["apply_template"] = record_template(server, write_variant("f32", Path(d)), 8741)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Records llama-server's answers for gpt-oss's harmony template on the tiny random gpt-oss model into
tests/data/harmony_reference.json (tests/test_gptoss.py compares tritium's with them): /apply-template
for a few conversations (system message, tools, reasoning effort, an earlier turn's reasoning; the
template's "Current date" line normalized), and a greedy chat completion, whole and streamed (the tiny
model writes no harmony channels: b1-0c1e570 answers 500 "does not match the expected peg-native
format", after the role chunk when streaming).

    python scripts/record_harmony_reference.py --server /work/lsb/llama-server
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from record_real_references import wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

TEMPLATE = REPO / "tests" / "data" / "templates" / "openai-gpt-oss-120b.jinja"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
                  {"role": "user", "content": "Weather in Paris?"}],
     "tools": TOOLS, "chat_template_kwargs": {"reasoning_effort": "high"}},
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
                   "tool_calls": [{"type": "function", "id": "c1",
                                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}],
     "tools": TOOLS},
]
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
DATE_RE = re.compile(r"Current date: \d{4}-\d{2}-\d{2}")


def normalize(prompt: str) -> str:
    return DATE_RE.sub("Current date: DATE", prompt)


def server_args(model: Path) -> list[str]:
    return ["-m", str(model), "-c", "1024", "-np", "1", "--jinja", "--chat-template-file", str(TEMPLATE)]


def events(raw: str) -> list:
    out = []
    for line in raw.splitlines():
        if line.startswith("data: "):
            d = line[6:]
            out.append(d if d == "[DONE]" else json.loads(d))
    return out


def main() -> int:
    import httpx

    import record_gptoss_reference as gr

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "harmony_reference.json"))
    ap.add_argument("--port", type=int, default=8677)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = gr.write_variant("f32", Path(d))
        proc = subprocess.Popen([a.server, *server_args(model), "--port", str(a.port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{a.port}"
        try:
            wait_ready(url, proc, timeout=120)
            prompts = [normalize(httpx.post(url + "/apply-template", json=c).json()["prompt"]) for c in CONVERSATIONS]
            whole = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=60)
            streamed = httpx.post(url + "/v1/chat/completions", json=dict(CHAT, stream=True), timeout=60)
        finally:
            proc.terminate()
            proc.wait()
    out = {"reference": "llama-server b1-0c1e570", "command": " ".join(["python", *sys.argv]),
           "server_args": server_args(Path("MODEL")), "conversations": CONVERSATIONS, "prompts": prompts,
           "chat": CHAT, "whole": {"status": whole.status_code, "body": whole.json()},
           "stream": {"status": streamed.status_code, "events": events(streamed.text)}}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Compare two llama-server compatible servers on the Responses API, the Anthropic Messages API and
the token-counting routes (scripts/compare_servers.py does the other routes the same way).

    python scripts/compare_apicompat.py http://127.0.0.1:8081 http://127.0.0.1:8091

Start both on the same model with the same flags, with --jinja and a template with tool calls,
e.g. `-np 2 -c 4096 --jinja --chat-template-file ../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja`.
Every request is greedy; for each, the script prints the status codes, JSON paths only one side has,
type and key-order differences, and the generated text and token counts when they differ. Streams
are compared event by event: the event names in order, then each event's shape. Ids, timestamps and
timings are not compared. Exit status 1 when any difference was found.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_servers import call, diff  # noqa: E402

USER = [{"role": "user", "content": "Show me pom.xml"}]
FN = {"name": "read_file", "description": "Read a file from the workspace",
      "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["pom.xml", "src/Main.java"]}},
                     "required": ["path"]}}
A_TOOLS = [{"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}]
R_TOOLS = [{"type": "function", **FN}]
A_PREFILL = {"role": "assistant", "content": "<tool_call>\n"}
R_PREFILL = {"type": "message", "role": "assistant", "content": "<tool_call>\n"}
A_ROUND = USER + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file",
                                                      "input": {"path": "pom.xml"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "<project/>"}]}]
R_ROUND = USER + [{"type": "function_call", "call_id": "call_1", "name": "read_file",
                   "arguments": "{\"path\":\"pom.xml\"}"},
                  {"type": "function_call_output", "call_id": "call_1", "output": "<project/>"}]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}

REQUESTS: list[tuple[str, Any]] = [
    ("/v1/responses", {"input": "Say hello", "max_output_tokens": 8, "temperature": 0}),
    ("/responses", {"input": USER, "instructions": "Be brief.", "max_output_tokens": 8, "temperature": 0}),
    ("/v1/responses", {"input": USER + [R_PREFILL], "tools": R_TOOLS, "tool_choice": "required",
                       "max_output_tokens": 60, "temperature": 0}),
    ("/v1/responses", {"input": R_ROUND, "tools": R_TOOLS, "max_output_tokens": 8, "temperature": 0}),
    ("/v1/responses", {"input": "x", "previous_response_id": "resp_1"}),
    ("/v1/responses", {"input": [{"type": "nonsense"}]}),
    ("/v1/responses", {"max_output_tokens": 8}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
    ("/v1/messages", {"max_tokens": 8, "messages": USER, "temperature": 0}),
    ("/v1/messages", {"max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}], "messages": USER,
                      "temperature": 0, "stop_sequences": ["\n"]}),
    ("/v1/messages", {"max_tokens": 60, "messages": USER + [A_PREFILL], "tools": A_TOOLS,
                      "tool_choice": {"type": "any"}, "temperature": 0}),
    ("/v1/messages", {"max_tokens": 8, "messages": A_ROUND, "tools": A_TOOLS, "temperature": 0}),
    ("/v1/messages", {"max_tokens": 8, "messages": []}),
    ("/v1/messages", {"max_tokens": 8}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": [IMAGE]}]}),
    ("/v1/messages/count_tokens", {"messages": USER, "system": "Be brief.", "tools": A_TOOLS}),
    ("/v1/messages/count_tokens", {"messages": A_ROUND}),
    ("/v1/chat/completions/input_tokens", {"messages": USER, "tools": [{"type": "function", "function": FN}]}),
    ("/chat/completions/input_tokens", {"messages": USER}),
    ("/v1/chat/completions/input_tokens", {}),
    ("/v1/responses/input_tokens", {"input": R_ROUND, "tools": R_TOOLS}),
    ("/responses/input_tokens", {"input": "hi", "instructions": "Be brief."}),
]
STREAMS = [(p, {**b, "stream": True}) for p, b in REQUESTS[:4] + REQUESTS[8:12]]
VOLATILE = {"id", "created_at", "completed_at", "created", "timings", "call_id", "item_id", "system_fingerprint"}


def values(x: Any) -> Any:
    """The JSON without ids, timestamps and timings (tool-call ids are random on both sides), and
    with the prompt-cache split of usage folded (Anthropic's input_tokens excludes the cached ones)."""
    if isinstance(x, dict):
        x = dict(x)
        if isinstance(x.get("cache_read_input_tokens"), int) and isinstance(x.get("input_tokens"), int):
            x["input_tokens"] += x.pop("cache_read_input_tokens")
        x.pop("cached_tokens", None)
        return {k: values(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [values(v) for v in x]
    return x


def events(client: httpx.Client, base: str, path: str, body: dict) -> list[tuple[str, Any]]:
    out, name = [], ""
    with client.stream("POST", base + path, json=body) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
                name = ""
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first")
    ap.add_argument("second")
    args = ap.parse_args()
    a, b = args.first.rstrip("/"), args.second.rstrip("/")
    found = 0
    with httpx.Client(timeout=300, trust_env=False) as c:
        for path, body in REQUESTS:
            (sa, ja), (sb, jb) = call(c, a, "POST", path, body), call(c, b, "POST", path, body)
            problems = ([f"status {sa} vs {sb}"] if sa != sb else []) + diff(ja, jb)
            if not problems and values(ja) != values(jb):
                problems.append(f"values: {json.dumps(values(ja))[:300]}\n          vs {json.dumps(values(jb))[:300]}")
            print(("DIFF " if problems else "same ") + f"{path} {json.dumps(body)[:70]}")
            for line in problems:
                print("     " + line)
            found += bool(problems)
        for path, body in STREAMS:
            ea, eb = events(c, a, path, body), events(c, b, path, body)
            na, nb = [n or d.get("type", "") for n, d in ea], [n or d.get("type", "") for n, d in eb]
            problems = [] if na == nb else [f"events: {na}\n          vs {nb}"]
            for i, ((_, x), (_, y)) in enumerate(zip(ea, eb)):
                problems += [f"event {i} {na[i]}: {p}" for p in diff(x, y)]
                if not diff(x, y) and values(x) != values(y):
                    problems.append(f"event {i} {na[i]} values: {json.dumps(values(x))[:200]} vs "
                                    f"{json.dumps(values(y))[:200]}")
            print(("DIFF " if problems else "same ") + f"stream {path} {json.dumps(body)[:70]}")
            for line in problems[:12]:
                print("     " + line)
            found += bool(problems)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

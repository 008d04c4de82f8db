#!/usr/bin/env python3
"""Compare the JSON shape of two llama-server compatible servers, endpoint by endpoint.

    python scripts/compare_servers.py http://127.0.0.1:8081 http://127.0.0.1:8091

Start both on the same model with the same flags (for example the reference from
scripts/build_llama_server.sh on 8081 with `-np 2 -c 4096 --metrics`, tritium on 8091 with the same).
For each request below, both servers get the same body; the script prints the status codes, the
JSON paths only one side has, paths whose value types differ, key-order differences, and the error
bodies. For streams it compares every chunk, and /metrics by metric names. Values are not compared
(sampling, timings and ids differ by nature); greedy token ids are, with --tokens.
Exit status 1 when any difference was found.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

REQUESTS: list[tuple[str, str, Any]] = [
    ("GET", "/health", None), ("GET", "/props", None), ("GET", "/v1/models", None), ("GET", "/models", None),
    ("POST", "/tokenize", {"content": "hello world", "with_pieces": True}),
    ("POST", "/detokenize", {"tokens": [14990, 1879]}),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/completion", {"prompt": "hello", "n_predict": 3, "temperature": 0}),
    ("POST", "/completion", {"prompt": "hello", "n_predict": 3, "temperature": 0, "n_probs": 2}),
    ("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 3, "temperature": 0}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                      "temperature": 0}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                      "temperature": 0, "logprobs": True, "top_logprobs": 2}),
    ("GET", "/slots", None),
    ("POST", "/completion", {"n_predict": 3}),
    ("POST", "/completion", "not json"),
    ("POST", "/v1/chat/completions", {"messages": "x"}),
    ("GET", "/nope", None),
    ("POST", "/infill", {"input_prefix": "a", "input_suffix": "b"}),
    ("POST", "/v1/embeddings", {"input": "hello"}),
    ("POST", "/slots/0?action=bogus", {"filename": "c.bin"}),
]
STREAMS: list[tuple[str, dict]] = [
    ("/completion", {"prompt": "hello", "n_predict": 3, "temperature": 0, "stream": True}),
    ("/completion", {"prompt": "hello", "n_predict": 3, "temperature": 0, "stream": True, "n_probs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
                              "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
                              "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 0, "stream": True}),
]
PROMPTS = ["hello world", "The quick brown fox jumps over", "def main():\n    print("]


def paths(x: Any, p: str = "") -> list[tuple[str, str]]:
    """(path, type) of every node, dict keys in order; lists by their first element."""
    if isinstance(x, dict):
        out = [(p or ".", "dict")]
        for k, v in x.items():
            out += paths(v, f"{p}.{k}")
        return out
    if isinstance(x, list):
        return [(p + "[]", "list")] + (paths(x[0], p + "[0]") if x else [])
    kind = "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__
    return [(p, kind)]


def diff(a: Any, b: Any) -> list[str]:
    pa, pb = paths(a), paths(b)
    da, db = dict(pa), dict(pb)
    out = []
    only_a = [k for k, _ in pa if k not in db]
    only_b = [k for k, _ in pb if k not in da]
    if only_a:
        out.append(f"only first: {only_a[:20]}")
    if only_b:
        out.append(f"only second: {only_b[:20]}")
    types = [(k, da[k], db[k]) for k in da if k in db and da[k] != db[k]]
    if types:
        out.append(f"types: {types[:10]}")
    common_a = [k for k, _ in pa if k in db]
    common_b = [k for k, _ in pb if k in da]
    if not only_a and not only_b and common_a != common_b:
        out.append("key order differs")
    return out


def call(client: httpx.Client, base: str, method: str, path: str, body: Any) -> tuple[int, Any]:
    if method == "GET":
        r = client.get(base + path)
    elif isinstance(body, str):
        r = client.post(base + path, content=body)
    else:
        r = client.post(base + path, json=body)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text[:200]


def stream(client: httpx.Client, base: str, path: str, body: dict) -> list[Any]:
    out: list[Any] = []
    with client.stream("POST", base + path, json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--tokens", action="store_true", help="also compare greedy /completion token ids")
    args = ap.parse_args()
    a, b = args.first.rstrip("/"), args.second.rstrip("/")
    found = 0
    with httpx.Client(timeout=120, trust_env=False) as c:
        for method, path, body in REQUESTS:
            (sa, ja), (sb, jb) = call(c, a, method, path, body), call(c, b, method, path, body)
            problems = ([f"status {sa} vs {sb}"] if sa != sb else []) + diff(ja, jb)
            label = f"{method} {path} {json.dumps(body)[:60] if body is not None else ''}"
            print(("DIFF " if problems else "same ") + label)
            for line in problems:
                print("     " + line)
            if isinstance(ja, dict) and "error" in ja:
                print(f"     first:  {json.dumps(ja)[:240]}\n     second: {json.dumps(jb)[:240]}")
            found += bool(problems)
        for path, body in STREAMS:
            ca, cb = stream(c, a, path, body), stream(c, b, path, body)
            problems = [f"{len(ca)} vs {len(cb)} events"] if len(ca) != len(cb) else []
            for i, (x, y) in enumerate(zip(ca, cb)):
                if x == "[DONE]" or y == "[DONE]":
                    if x != y:
                        problems.append(f"event {i}: {str(x)[:40]} vs {str(y)[:40]}")
                    continue
                problems += [f"event {i}: {p}" for p in diff(x, y)]
            print(("DIFF " if problems else "same ") + f"stream {path} {json.dumps(body)[:60]}")
            for line in problems[:10]:
                print("     " + line)
            found += bool(problems)
        names = []
        for base in (a, b):
            text = c.get(base + "/metrics").text
            names.append([line.split()[0] for line in text.splitlines() if line and not line.startswith("#")])
        same = names[0] == names[1]
        print(("same " if same else "DIFF ") + "/metrics names and order")
        found += not same
        if args.tokens:
            for prompt in PROMPTS:
                body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "return_tokens": True,
                        "cache_prompt": False}
                ta, tb = (call(c, base, "POST", "/completion", body)[1].get("tokens") for base in (a, b))
                print(("same " if ta == tb else "DIFF ") + f"greedy tokens for {prompt!r}")
                found += ta != tb
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

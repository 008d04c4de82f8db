"""Records llama-server b1-0c1e570's router (no -m, `--models-dir`) on generated tiny models into
tests/data/router_reference.json: one `GET /models` entry per state seen (unloaded, loaded, a
failed load), the router's `/props`, the `/models/sse` events of a load and an unload, and the
status and JSON of the routing errors. tests/test_router.py sends the same requests to
`tritium-server --models-dir` and compares.

    python scripts/record_router_reference.py --server /work/lsb/llama-server --out tests/data/router_reference.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (method, path, body) sent once tiny-a is loaded
ERRORS = [
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/models/load", {"model": "nope"}),
    ("POST", "/models/load", {"model": "tiny-a"}),
    ("POST", "/models/unload", {"model": "nope"}),
    ("POST", "/models/unload", {"model": "tiny-c"}),
    ("GET", "/slots", None),
    ("GET", "/metrics?model=nope", None),
]


def request(base: str, method: str, path: str, body: object = None, timeout: float = 120) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode()


def wait_status(base: str, name: str, want: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, body = request(base, "GET", "/models")
        m = next(m for m in body["data"] if m["id"] == name)
        if m["status"]["value"] == want:
            return m
        time.sleep(0.05)
    raise SystemExit(f"{name} never reached {want}")


def main() -> int:
    from runtime.model.tiny_model import BUILTIN_SPEC, write_tiny_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="llama-server b1-0c1e570")
    ap.add_argument("--out", default="tests/data/router_reference.json")
    ap.add_argument("--port", type=int, default=18741)
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    out: dict = {"server": "llama-server b1-0c1e570", "args": "--models-dir DIR --models-max 2 -c 256 -np 1"}
    with tempfile.TemporaryDirectory() as d:
        for name, seed in (("tiny-a", 1), ("tiny-b", 2), ("tiny-c", 3)):
            write_tiny_model(Path(d) / f"{name}.gguf", replace(BUILTIN_SPEC, seed=seed), vocab="builtin")
        (Path(d) / "broken.gguf").write_bytes(b"GGUF not really")
        proc = subprocess.Popen([a.server, "--models-dir", d, "--models-max", "2", "-c", "256", "-np", "1",
                                 "--port", str(a.port), "--no-webui"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={"LLAMA_CACHE": str(Path(d) / "cache"),
                                                                "PATH": "/usr/bin:/bin"})
        try:
            for _ in range(600):
                try:
                    if request(base, "GET", "/health", timeout=1)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            events: list = []

            def listen() -> None:
                with urllib.request.urlopen(base + "/models/sse", timeout=120) as r:
                    for line in r:
                        if line.startswith(b"data: "):
                            events.append(json.loads(line[6:]))
            threading.Thread(target=listen, daemon=True).start()
            time.sleep(0.5)
            models = {"unloaded": wait_status(base, "tiny-a", "unloaded")}
            out["props"] = request(base, "GET", "/props")[1]
            status, chat = request(base, "POST", "/v1/chat/completions",
                                   {"model": "tiny-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            out["chat"] = {"status": status, "keys": sorted(chat)}
            models["loaded"] = wait_status(base, "tiny-a", "loaded")
            out["errors"] = []
            for method, path, body in ERRORS:
                status, resp = request(base, method, path, body)
                out["errors"].append({"method": method, "path": path, "body": body, "status": status, "response": resp})
            status, resp = request(base, "POST", "/v1/completions", {"model": "broken", "prompt": "hi"})
            out["failed_load"] = {"status": status, "response": resp}
            models["failed"] = wait_status(base, "broken", "unloaded")
            request(base, "POST", "/models/unload", {"model": "tiny-a"})
            wait_status(base, "tiny-a", "unloaded")
            time.sleep(0.5)
            out["models"] = models
            out["sse_events"] = events
        finally:
            proc.terminate()
            proc.wait()
    Path(a.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

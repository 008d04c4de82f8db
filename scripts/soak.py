#!/usr/bin/env python3
"""Soak test (issue #13): N concurrent clients mixing ordinary requests with faults, for M minutes.

Each client loops over a random mix: completions and chat (whole and streamed), streams dropped
mid-way, non-streamed generations abandoned by their client, JSON-schema grammars with huge bounds,
malformed bodies (NaN, 10,000-deep nesting, lone surrogates, random bytes), oversize bodies,
half-open connections, n_probs amplification, tokenize / slots / metrics / health.

Reports: the server's RSS (after warm-up, peak, at the end once idle) and its growth, slots still
busy once every client has stopped (leaked), requests per kind, and every unexpected answer (a 5xx
other than the JSON parse error, an error outside the envelope, a transport error on a request
that should have been answered).

    python scripts/soak.py --model /tmp/tiny.gguf --minutes 10 --clients 32      # starts a server
    python scripts/soak.py --url http://127.0.0.1:8080 --pid 1234 --minutes 10     # an existing one
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Soak:
    def __init__(self, url: str, seed: int, max_body: int):
        self.url = url
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.rng = random.Random(seed)
        self.max_body = max_body
        self.counts: Counter = Counter()
        self.unexpected: list[str] = []
        self.stop_at = 0.0

    # ---- checks ---------------------------------------------------------------------------
    def bad(self, kind: str, what: str) -> None:
        self.counts["unexpected"] += 1
        if len(self.unexpected) < 50:
            self.unexpected.append(f"{kind}: {what[:300]}")

    def check(self, kind: str, r: httpx.Response, expect: tuple[int, ...] = ()) -> None:
        self.counts[kind] += 1
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                ok = err["code"] == r.status_code and "message" in err and "type" in err
            except Exception:  # noqa: BLE001
                ok = False
            if not ok:
                self.bad(kind, f"{r.status_code} outside the envelope: {r.text[:200]}")
                return
            documented = ((r.status_code == 500 and err["message"].startswith("[json.exception"))
                          or (r.status_code == 501 and err["type"] == "not_supported_error"))
            if r.status_code >= 500 and not documented:
                self.bad(kind, f"{r.status_code}: {r.text[:200]}")
                return
        if expect and r.status_code not in expect:
            self.bad(kind, f"status {r.status_code}, expected {expect}: {r.text[:200]}")

    # ---- the mix --------------------------------------------------------------------------
    async def completion(self, c: httpx.AsyncClient) -> None:
        r = await c.post("/completion", json={"prompt": self.words(), "n_predict": self.rng.randint(1, 24)})
        self.check("completion", r, (200,))

    async def chat_schema(self, c: httpx.AsyncClient) -> None:
        schema = self.rng.choice([{"type": "array", "minItems": 1000000000, "items": {"type": "integer"}},
                                  {"type": "string", "minLength": 10000000},
                                  {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}])
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": self.words()}], "max_tokens": 12,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
        self.check("chat_schema", r, (200,))

    async def stream(self, c: httpx.AsyncClient, drop: bool) -> None:
        kind = "stream_dropped" if drop else "stream"
        body = {"messages": [{"role": "user", "content": self.words()}], "max_tokens": 64 if drop else 16,
                "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            n = 0
            async for chunk in r.aiter_bytes():
                n += 1
                if drop and n >= self.rng.randint(1, 4):
                    break  # leaving the context closes the connection mid-stream
        self.check(kind, r, (200,))

    async def abandoned(self) -> None:
        """A non-streamed generation whose client leaves after a moment."""
        body = json.dumps({"prompt": self.words(), "n_predict": -1, "ignore_eos": True}).encode()
        _, w = await asyncio.open_connection(self.host, self.port)
        w.write(b"POST /completion HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()
        await asyncio.sleep(self.rng.uniform(0.2, 1.5))
        w.close()
        self.counts["abandoned"] += 1

    async def half_open(self) -> None:
        _, w = await asyncio.open_connection(self.host, self.port)
        w.write(b"POST /completion HTTP/1.1\r\nHost: soak\r\n")
        await w.drain()
        await asyncio.sleep(self.rng.uniform(0.5, 3))
        w.close()
        self.counts["half_open"] += 1

    async def malformed(self, c: httpx.AsyncClient) -> None:
        tool_calls = b'{"messages":[{"role":"assistant","content":"","tool_calls":[["a"]]}]}'
        raw = self.rng.choice([tool_calls, b"[" * 10000, b'{"prompt":"hi","temperature":NaN}', b'{"prompt":"\\ud800"}',
                               b'{"prompt":"hi","n_predict":1e400}', bytes(self.rng.randbytes(40)),
                               b'{"prompt":"hi","json_schema":' + b'{"type":"array","items":' * 3000 + b"{}" +
                               b"}" * 3000 + b"}"])
        path = self.rng.choice(["/completion", "/v1/chat/completions", "/tokenize", "/infill", "/v1/embeddings"])
        r = await c.post(path, content=raw)
        self.check("malformed", r)
        if r.status_code < 400 and not (raw is tool_calls and path != "/v1/chat/completions"):
            self.bad("malformed", f"{path} accepted {raw[:60]!r}")

    async def oversize(self, c: httpx.AsyncClient) -> None:
        r = await c.post("/completion", content=b'{"prompt":"' + b"a" * (self.max_body + 1) + b'"}')
        self.check("oversize", r, (413,))

    async def n_probs(self, c: httpx.AsyncClient) -> None:
        r = await c.post("/completion", json={"prompt": "hi", "n_predict": 3, "n_probs": 1000000})
        self.check("n_probs", r, (200,))

    async def light(self, c: httpx.AsyncClient) -> None:
        path = self.rng.choice(["/health", "/slots", "/metrics", "/props", "/v1/models"])
        r = await c.get(path)
        self.check("light", r, (200, 501))
        r = await c.post("/tokenize", json={"content": self.words(), "with_pieces": True})
        self.check("light", r, (200,))

    def words(self) -> str:
        return " ".join(self.rng.choice(["the", "cat", "json", "list", "ok", "why", "0", "π"])
                        for _ in range(self.rng.randint(1, 40)))

    async def client(self, i: int) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as c:
            while time.monotonic() < self.stop_at:
                pick = self.rng.random()
                try:
                    if pick < 0.20:
                        await self.completion(c)
                    elif pick < 0.32:
                        await self.stream(c, drop=False)
                    elif pick < 0.44:
                        await self.stream(c, drop=True)
                    elif pick < 0.52:
                        await self.abandoned()
                    elif pick < 0.60:
                        await self.chat_schema(c)
                    elif pick < 0.72:
                        await self.malformed(c)
                    elif pick < 0.76:
                        await self.oversize(c)
                    elif pick < 0.80:
                        await self.half_open()
                    elif pick < 0.84:
                        await self.n_probs(c)
                    else:
                        await self.light(c)
                except (httpx.HTTPError, OSError) as e:
                    self.bad("transport", f"{type(e).__name__}: {e}")


async def run(args, url: str, pid: int | None) -> dict:
    soak = Soak(url, args.seed, args.max_body_size)
    rss: list[tuple[float, float]] = []
    t0 = time.monotonic()
    soak.stop_at = t0 + args.minutes * 60

    async def sample() -> None:
        while time.monotonic() < soak.stop_at:
            if pid:
                rss.append((time.monotonic() - t0, rss_mib(pid)))
            await asyncio.sleep(5)

    await asyncio.gather(sample(), *(soak.client(i) for i in range(args.clients)))
    # quiesce: every client has stopped; abandoned work must be gone within seconds
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        busy = []
        for _ in range(100):
            busy = [s["id"] for s in (await c.get("/slots")).json() if s["is_processing"]]
            if not busy:
                break
            await asyncio.sleep(0.1)
        leaked = [s for s in (await c.get("/slots")).json() if s["is_processing"]]
        t_leak = time.monotonic()
        while leaked and time.monotonic() - t_leak < 120:  # a leak: how long until the slot is free?
            await asyncio.sleep(1)
            still = [s for s in (await c.get("/slots")).json() if s["is_processing"]]
            if not still:
                break
        leak_info = {"slots": [{k: s.get(k) for k in ("id", "id_task", "n_ctx", "next_token", "params")}
                               for s in leaked], "freed_after_s": round(time.monotonic() - t_leak, 1)} if busy else {}
        healthy = (await c.get("/health")).status_code == 200
    await asyncio.sleep(2)
    warm = [v for t, v in rss if t >= min(60.0, args.minutes * 60 / 4)]
    end = rss_mib(pid) if pid else float("nan")
    base = warm[0] if warm else (rss[0][1] if rss else float("nan"))
    return {
        "minutes": args.minutes, "clients": args.clients, "requests": dict(soak.counts),
        "rss_mib": {"after_warmup": round(base, 1), "peak": round(max((v for _, v in rss), default=end), 1),
                    "end_idle": round(end, 1), "growth_after_warmup": round(end - base, 1)},
        "slots_leaked": busy, "leak_info": leak_info, "healthy_after": healthy, "unexpected": soak.unexpected,
    }


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "api.cli", "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
           "-np", str(args.parallel), "-c", str(args.ctx), "--max-body-size", str(args.max_body_size),
           "--header-timeout", "2", "--metrics"]
    log = open(args.log, "wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"server exited: see {args.log}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server not ready")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="start a server on this GGUF")
    ap.add_argument("--url", help="use a running server instead")
    ap.add_argument("--pid", type=int, help="the running server's pid (for RSS)")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=4, help="-np of the started server")
    ap.add_argument("--ctx", type=int, default=8192, help="-c of the started server")
    ap.add_argument("--max-body-size", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default="/tmp/tritium-soak-server.log")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    proc = None
    if args.url:
        url, pid = args.url, args.pid
    elif args.model:
        proc, url = start_server(args)
        pid = proc.pid
    else:
        ap.error("--model or --url")
    try:
        report = asyncio.run(run(args, url, pid))
    finally:
        if proc is not None:
            proc.terminate()
            report_rc = proc.wait(30)
    if proc is not None:
        report["server_exit_code_on_sigterm"] = report_rc
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    ok = not report["slots_leaked"] and report["healthy_after"] and not report["unexpected"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

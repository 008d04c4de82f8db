#!/usr/bin/env python3
"""/health latency while one huge request is processed (issue #13: tokenizing a prompt must not
block the event loop for other clients).

The big request is sent by a separate `curl` process (so this process's GIL does not skew the
numbers) while /health is polled every 50 ms over one keep-alive connection.

    python scripts/health_under_load.py --url http://127.0.0.1:8080 --words 650000   # ~5 MB prompt
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time

import httpx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--words", type=int, default=650_000, help="prompt words (about 7.8 bytes each)")
    ap.add_argument("--path", default="/completion")
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump({"prompt": " ".join(f"w{i}" for i in range(args.words)), "n_predict": 1}, f)
        f.flush()
        size = f.tell()
        curl = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}", "-H",
                                 "Content-Type: application/json", "--data-binary", f"@{f.name}", args.url + args.path],
                                stdout=subprocess.PIPE, text=True)
        lat: list[float] = []
        with httpx.Client(timeout=600) as c:
            while curl.poll() is None:
                t0 = time.monotonic()
                c.get(args.url + "/health")
                lat.append(time.monotonic() - t0)
                time.sleep(0.05)
        status, seconds = curl.stdout.read().split()
    lat = sorted(lat) or [0.0]
    print(f"body {size / 1e6:.1f} MB: HTTP {status} after {float(seconds):.1f} s; /health polls {len(lat)}, "
          f"median {lat[len(lat) // 2] * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99)] * 1000:.0f} ms, "
          f"max {lat[-1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()

"""`/health` latency probes shared by the black-box tests that load a server with something heavy
(tests/test_isolation_api.py, tests/test_hardening_server.py, tests/test_fuzz_victim.py)."""
from __future__ import annotations

import time
from typing import Callable

import httpx


def probe_health(url: str, busy: Callable[[], bool], interval_s: float, bad: list | None = None) -> list[float]:
    """GET url/health every `interval_s` while `busy()`; the latencies in seconds, in order. A
    status other than 200 (or a transport error, as its repr) is appended to `bad` when it is
    given, else it fails the test at once."""
    lat: list[float] = []
    with httpx.Client(timeout=30) as c:
        while busy():
            t0 = time.monotonic()
            try:
                code: int | str = c.get(url + "/health").status_code
            except httpx.HTTPError as e:
                if bad is None:
                    raise
                code = repr(e)
            lat.append(time.monotonic() - t0)
            if code != 200:
                assert bad is not None, code
                bad.append(code)
            time.sleep(interval_s)
    return lat


def p99(lat: list[float]) -> float:
    s = sorted(lat)
    return s[min(len(s) - 1, int(len(s) * 0.99))]

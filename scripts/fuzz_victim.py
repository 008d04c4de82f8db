#!/usr/bin/env python3
"""The longer run of tests/test_fuzz_victim.py: hypothesis request bodies against a real tritium
server (`-np 2`, a tiny generated model unless --model) while a greedy victim stream runs in slot 0
and /health is polled; prints the invariants' measurements and exits 1 when one fails.

    python scripts/fuzz_victim.py [--examples 5000] [--seed random|N] [--model F.gguf]
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.model.tiny_model import spec_with, write_tiny_model  # noqa: E402
from tests.conftest import ServerProcess  # noqa: E402
from tests.health_probe import p99  # noqa: E402
from tests.test_fuzz_victim import PYTHON_WORDS, RSS_GROWTH_MB, Watch, fuzz, rss_mb, victim  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=5000)
    ap.add_argument("--seed", default="random")
    ap.add_argument("--model", default="")
    a = ap.parse_args()
    model = a.model or str(Path(tempfile.gettempdir()) / "fuzz-victim-tiny.gguf")
    if not a.model:
        write_tiny_model(model, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048,
                                          name="fuzz-victim-tiny", seed=7), vocab="builtin")
    server = ServerProcess(["-m", model, "-c", "2048", "-np", "2", "--metrics", "--slots"],
                           Path(tempfile.gettempdir()) / "fuzz-victim-server.log")
    url, proc = server.url, server.proc
    try:
        server.wait_ready(120)
        alone = victim(url)
        fuzz(url, 20, "1")
        rss0 = rss_mb(proc.pid)
        statuses: collections.Counter = collections.Counter()
        watch = Watch(url, alone)
        t0 = time.monotonic()
        try:
            messages = fuzz(url, a.examples, a.seed, lambda path, code: statuses.update([(path, code)]))
            errors_5xx = [m for (p, m) in statuses if p == "5xx"]
        finally:
            watch.finish()
        rss1 = rss_mb(proc.pid)
        lat = watch.health
        leaked = sorted({m[:200] for m in messages if PYTHON_WORDS.search(m)})
        print(f"{a.examples} bodies in {time.monotonic() - t0:.0f} s; victims {watch.victims} "
              f"(wrong: {len(watch.wrong)}); /health n={len(lat)} p99={p99(lat) * 1e3:.0f} ms "
              f"max={max(lat) * 1e3:.0f} ms, not 200: {len(watch.bad_health)}; RSS {rss0:.0f} -> {rss1:.0f} MB; "
              f"{len(set(messages))} distinct error messages, {len(leaked)} naming Python")
        for (path, code), n in sorted((k, v) for k, v in statuses.items() if k[0] != "5xx"):
            print(f"  {path} {code}: {n}")
        for m in errors_5xx:
            print("  5xx:", m)
        for m in leaked[:20] + watch.wrong[:5]:
            print("  !", m)
        ok = not watch.wrong and not watch.bad_health and not leaked and rss1 - rss0 < RSS_GROWTH_MB
        return 0 if ok else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Record llama.cpp b1-0c1e570's ngram-cache behaviour for tests/test_ngram_cache.py:

    python scripts/record_ngram_cache_reference.py [--llama-cpp DIR]

builds scripts/ngram_cache_ref.cpp with DIR/common/ngram-cache.cpp (g++), then records into
tests/data/: the bucket counts a libstdc++ unordered_map grows through; a static lookup cache as
llama-lookup-create writes it (ngram_cache_static.bin, made from `static_tokens`) and the sha256 of
a full 1-4-gram cache of `dynamic_tokens` (the bytes common_ngram_cache_save writes); and the
drafts of common_speculative_impl_ngram_cache over a scripted run of several slots with both
files loaded: each call is (slot, task, n): the slot's history is the task's first n tokens and the
last sampled token its (n+1)th; the history then grows by the draft's accepted prefix (the tokens
that agree with the task's own continuation) and one token, as llama-server's verify step does.
Tasks are code-like: a block of tokens, then the same block with a few edits.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
DEFAULT_LLAMA = Path("/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp")


def build(llama: Path, out: Path) -> Path:
    exe = out / "ngram_cache_ref"
    cmd = ["g++", "-O1", "-std=c++17", f"-I{llama}/common", f"-I{llama}/include", f"-I{llama}/ggml/include",
           str(ROOT / "scripts" / "ngram_cache_ref.cpp"), str(llama / "common" / "ngram-cache.cpp"), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


# records of common_ngram_cache_save's layout (int32 LE): 4 tokens, n, n x (token, count)
ODD_HEX = ("0700000008000000ffffffffffffffff" "02000000" "0900000003000000" "0a00000001000000"
           "0700000008000000ffffffffffffffff" "01000000" "0b00000005000000"
           "0c000000ffffffffffffffffffffffff" "03000000" "0d00000002000000" "0d00000004000000" "0e00000001000000"
           "01020304050607")


def alphabet(rng: random.Random, n: int) -> list[int]:
    """Token ids spread over a real vocabulary's range (the maps' buckets depend on the values)."""
    return rng.sample(range(151000), n)


def tasks(rng: random.Random) -> list[list[int]]:
    out = []
    for k in range(6):
        alpha = alphabet(rng, 12 + 10 * k)
        block = [rng.choice(alpha) for _ in range(60 + 25 * k)]
        edited = [rng.choice(alpha) if rng.random() < 0.08 else t for t in block]
        lead = [rng.choice(alpha) for _ in range(rng.randrange(1, 6))]
        out.append(lead + block + edited + [rng.choice(alpha) for _ in range(20)])
    return out


class Ref:
    def __init__(self, exe: Path):
        self.p = subprocess.Popen([str(exe), "run", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> str:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, default=DEFAULT_LLAMA)
    args = ap.parse_args()
    rng = random.Random(34)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        exe = build(args.llama_cpp, work)
        growth = [int(x) for x in subprocess.run([str(exe), "growth"], capture_output=True, text=True,
                                                 check=True).stdout.split()]
        alpha = alphabet(rng, 40)
        static_tokens = [rng.choice(alpha) for _ in range(900)]
        dynamic_tokens = [rng.choice(alpha) for _ in range(300)]
        ref = Ref(exe)
        static_bin, dynamic_bin = DATA / "ngram_cache_static.bin", work / "dynamic.bin"
        ref.ask(f"create_static {static_bin} " + " ".join(map(str, static_tokens)))
        ref.ask(f"create_full {dynamic_bin} " + " ".join(map(str, dynamic_tokens)))
        dynamic_sha = hashlib.sha256(dynamic_bin.read_bytes()).hexdigest()
        ref.ask(f"resave {static_bin} {work / 'resaved.bin'}")
        resaved_sha = hashlib.sha256((work / "resaved.bin").read_bytes()).hexdigest()
        # a hand-built file: a repeated n-gram and a repeated follower (the first stays), 7 stray bytes
        odd = work / "odd.bin"
        odd.write_bytes(bytes.fromhex(ODD_HEX))
        odd_dump = ref.ask(f"dump {odd}")
        # the tasks draw from the corpora's alphabet too, so the static and dynamic caches take part
        ts = tasks(rng)
        ts[0] = [rng.choice(alpha) for _ in range(30)] + static_tokens[100:160] + dynamic_tokens[50:90]
        calls = []
        for run_files in ((f"{static_bin}", f"{dynamic_bin}"), ("-", "-")):
            ref.ask(f"spec 3 {run_files[0]} {run_files[1]}")
            runs = []
            # slot 0 runs tasks 0 then 1 (the context cache carries over), slot 1 task 2, slot 2 3..5
            # (task 4 from a 3-token history: b1 reads out of bounds below 3 + id_last)
            plan = [(0, 0, 10), (1, 2, 25), (2, 3, 30), (0, 1, 40), (2, 4, 3), (2, 5, 50)]
            for sid, ti, n0 in plan:
                task, n = ts[ti], n0
                while n < len(task) - 1:
                    got = ref.ask(f"draft {sid} {task[n]} " + " ".join(map(str, task[:n]))).split()[1:]
                    draft = [int(x) for x in got]
                    runs.append([sid, ti, n, draft])
                    acc = 0
                    while acc < len(draft) and n + 1 + acc < len(task) and draft[acc] == task[n + 1 + acc]:
                        acc += 1
                    n += acc + 1
            calls.append({"static": run_files[0] != "-", "dynamic": run_files[1] != "-", "calls": runs})
        ref.close()
    out = {"recorded_with": "python scripts/record_ngram_cache_reference.py (scripts/ngram_cache_ref.cpp with "
                            "llama.cpp b1-0c1e570's common/ngram-cache.cpp, g++ 12 / libstdc++)",
           "growth": growth, "static_tokens": static_tokens, "dynamic_tokens": dynamic_tokens,
           "dynamic_sha256": dynamic_sha, "static_resaved_sha256": resaved_sha, "odd_hex": ODD_HEX, "odd_dump": odd_dump, "tasks": ts, "runs": calls}
    (DATA / "ngram_cache_reference.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")
    n_draft = sum(1 for r in calls for c in r["calls"] if c[3])
    print(f"growth {growth[:6]}...; {sum(len(r['calls']) for r in calls)} draft calls, {n_draft} with a draft; "
          f"static file {static_bin.stat().st_size} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

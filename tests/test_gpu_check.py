"""scripts/gpu_check.sh --dry-run: the GPU check's own script, every step, on the CPU (Triton
interpreter, tiny shapes, a tiny model served on the CPU), so that it cannot rot between the
rare runs on a lent GPU; and what it leaves for the device tool to bring back (at most 8 files:
summary.json, summary.txt, logs.tar.gz)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("deps", "precompile", "model", "timings", "e2e", "agreement")


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, TRITIUM_CACHE=str(tmp_path / "cache"), GPU_CHECK_PORT="8191", PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=2400, env=env)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    files = sorted(f.name for f in out.rglob("*") if f.is_file())
    assert files == ["logs.tar.gz", "summary.json", "summary.txt"], files  # within the device tool's 8
    s = json.loads((out / "summary.json").read_text())
    assert s["dry_run"] and [st["step"] for st in s["steps"]] == list(STEPS)
    assert all(st["rc"] == "0" for st in s["steps"]), s["steps"]
    assert set(s["decode"]) == {"1", "2"} and all(d["tok_s_per_stream"] > 0 and d["requests"] == 2 * int(c)
                                                  for c, d in s["decode"].items()), s["decode"]
    assert {p["prompt_tokens"] for p in s["prefill"].values()} == {64, 128}
    assert all(p["tok_s"] > 0 for p in s["prefill"].values())
    assert s["kernel_failures"] == [] and s["kernels"]["kernel_failures"] == 0
    a = s["agreement"]
    assert a["prompts"] == 2 and 0.0 <= a["forced_top1_agreement"] <= 1.0 and a["forced_logits_rel_err"] < 0.1
    assert s["weights_bytes_per_token"] > 0 and s["bound_tok_s"] > 0 and s["server_ready_s"] is not None
    txt = (out / "summary.txt").read_text()
    assert "DRY RUN" in txt and "| streams |" in txt and len(txt.splitlines()) <= 40  # one screen
    with tarfile.open(out / "logs.tar.gz") as t:
        names = {Path(n).name for n in t.getnames()}
    assert {f"{st}.log" for st in STEPS} | {"server.log", "timings.json", "agreement.json", "e2e.jsonl"} <= names

"""scripts/gpu_check.sh --dry-run: the GPU check's own script, every step, on the CPU (Triton
interpreter, tiny shapes, a tiny model served on the CPU), so that it cannot rot between the
rare runs on a lent GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, TRITIUM_CACHE=str(tmp_path / "cache"), GPU_CHECK_PORT="8191", PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=2400, env=env)
    summary = (out / "summary.txt").read_text()
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    for step in ("deps", "precompile", "tests", "timings", "e2e"):
        assert f"{step}" in summary and (out / f"{step}.log").exists(), step
        assert any(line.startswith(step) and "rc=0" in line for line in summary.splitlines()), (step, summary)
    assert "DRY RUN" in summary
    assert "passed" in summary and "failed" not in summary.split("-- tests")[1].split("--")[0]
    assert "E2E {" in summary and "decode_tokens_per_s" in summary
    assert (out / "timings.json").exists() and (out / "e2e.jsonl").read_text().strip()
    assert len(summary.splitlines()) <= 40  # one screen

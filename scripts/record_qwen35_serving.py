#!/usr/bin/env python3
"""Records llama-server's serving of the tiny random qwen35 model (scripts/record_qwen35_reference.py's
"f32" variant) into tests/data/qwen35_serving.json and tests/data/qwen35_slot.bin; tests/test_qwen35.py
runs the same `scenario` against tritium and compares.

The scenario (`scenario(url, slot_file)`), one slot, prompt caching on (the server's defaults: context
checkpoints, RAM prompt cache): a three-turn conversation in which each prompt extends the last one
with its answer and five new tokens, then a branch (the first prompt with another ending), another
conversation (the branch goes to the RAM prompt cache) and the branch continued (back from it), recording
per request the greedy tokens and `timings.prompt_n` (the prompt tokens the server evaluated: the
recurrent state resumed from the slot or a context checkpoint, or the prompt recomputed). Then the
slot is saved to a file (recorded: tests/data/qwen35_slot.bin), erased and restored, and a prompt
that extends the restored tokens exactly is completed from the restored recurrent state.

    python scripts/record_qwen35_serving.py --server /work/lsb/llama-server
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import record_qwen35_reference as ref  # noqa: E402

SERVER_ARGS = ["-c", "512", "-np", "1"]
FIRST = [1, 50, 300, 7, 99, 1000, 2000, 5] * 3
REQUEST = {"n_predict": 12, "temperature": 0.0, "top_k": 1, "return_tokens": True, "ignore_eos": True}


def scenario(url: str, slot_file: str) -> dict:
    """Runs the requests on a server at `url` started with `--slot-save-path` (the slot file's
    directory); returns what is recorded."""
    def complete(prompt: list[int]) -> dict:
        r = httpx.post(url + "/completion", json=dict(REQUEST, prompt=prompt), timeout=600)
        r.raise_for_status()
        j = r.json()
        return {"prompt": prompt, "tokens": j["tokens"], "prompt_n": j["timings"]["prompt_n"]}

    out: dict = {"turns": []}
    prompt = FIRST
    for _ in range(3):
        t = complete(prompt)
        out["turns"].append(t)
        prompt = prompt + t["tokens"] + [17, 18, 19, 20, 21]
    out["branch"] = complete(FIRST[:-3] + [44, 45])
    # another conversation takes the slot (the branch goes to the RAM prompt cache), then the branch
    # comes back (loaded from the RAM cache with its recurrent state and checkpoints)
    out["other"] = complete(list(range(300, 330)))
    back = FIRST[:-3] + [44, 45] + out["branch"]["tokens"] + [70, 71]
    out["back"] = complete(back)
    saved = back + out["back"]["tokens"][:-1]  # the slot holds the last token unevaluated
    r = httpx.post(url + "/slots/0?action=save", json={"filename": slot_file}, timeout=60).json()
    out["save"] = {"n_saved": r["n_saved"], "n_written": r["n_written"]}
    httpx.post(url + "/slots/0?action=erase", timeout=60).raise_for_status()
    r = httpx.post(url + "/slots/0?action=restore", json={"filename": slot_file}, timeout=60).json()
    out["restore"] = {"n_restored": r["n_restored"]}
    out["after_restore"] = complete(saved + [out["back"]["tokens"][-1], 60, 61])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--port", type=int, default=8671)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    model = ref.write_variant("f32", work)
    slots = work / "slots"
    slots.mkdir()
    proc = subprocess.Popen([args.server, "-m", str(model), *SERVER_ARGS, "--slot-save-path", str(slots),
                             "--port", str(args.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{args.port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        out = scenario(url, "slot.bin")
    finally:
        proc.terminate()
        proc.wait()
    out = {"reference": "llama-server b1-0c1e570", "command": "python scripts/record_qwen35_serving.py",
           "server_args": SERVER_ARGS, "variant": "f32", **out}
    (REPO / "tests" / "data" / "qwen35_serving.json").write_text(json.dumps(out, indent=1) + "\n")
    shutil.copy(slots / "slot.bin", REPO / "tests" / "data" / "qwen35_slot.bin")
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Records llama-server's greedy tokens with a draft model (-md, --spec-type draft-simple) on a tiny
random target/draft pair into tests/data/spec_draft_greedy.json (tests/test_spec_draft.py compares
tritium's with them).

The models are generated here, deterministically (`variants`: a 2-layer qwen2 target with tied
embeddings and a 1-layer draft drawn from the same seed, i.e. the target without its second layer,
both F32 on the built-in vocabulary), so that the tests regenerate the very
same files (their sha256 are recorded and checked) without the reference binary. Each prompt is
recorded under float32 attention (`-ctk f32 -ctv f32 -fa off`, scripts/record_moe_reference.py says
why) in four configurations: "plain" (no draft), "draft" (-md the draft, --spec-type draft-simple,
--spec-draft-n-max 4), "self" (the target as its own draft: every draft token accepted) and
"md_only" (-md without --spec-type: b1-0c1e570 uses no draft then); with each response's
timings.draft_n / draft_n_accepted (absent: null).

    python scripts/record_spec_draft_reference.py --server /work/lsb/llama-server \\
        --out tests/data/spec_draft_greedy.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from record_real_references import wait_ready  # noqa: E402
from runtime.model.tiny_model import TinyModelSpec  # noqa: E402

TARGET = TinyModelSpec(arch="qwen2", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=512,
                       name="tiny-random-qwen2", seed=41, init_std=0.05, tie_embeddings=True)
PROMPTS = moe_ref.TOKEN_PROMPTS
N_PREDICT = 32
F32ATTN = ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]
CONFIGS = {"plain": [], "draft": ["-md", "DRAFT", "--spec-type", "draft-simple", "--spec-draft-n-max", "4"],
           "self": ["-md", "TARGET", "--spec-type", "draft-simple", "--spec-draft-n-max", "4"],
           "md_only": ["-md", "DRAFT"]}


def variants() -> dict[str, TinyModelSpec]:
    # the draft: the target's embeddings (tied: also its output) and first layer, the same random stream,
    # without its second layer, so that it agrees with the target part of the time
    return {"target": TARGET, "draft": replace(TARGET, n_layer=1, name="tiny-random-qwen2-draft")}


def write_variant(name: str, out_dir: Path) -> Path:
    return moe_ref.write_spec("qwen2", name, variants()[name], out_dir)


def server_args(files: dict[str, Path], config: str) -> list[str]:
    extra = [str(files["draft"]) if a == "DRAFT" else str(files["target"]) if a == "TARGET" else a
             for a in CONFIGS[config]]
    return ["-m", str(files["target"]), "-c", "512", "-np", "1", "--no-warmup", "--cache-ram", "0", *F32ATTN, *extra]


def request(prompt) -> dict:
    return {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0.0, "top_k": 1, "seed": 1,
            "return_tokens": True, "cache_prompt": False, "ignore_eos": True}


def record(server: str, files: dict[str, Path], port: int, config: str) -> list[dict]:
    import httpx

    proc = subprocess.Popen([server, *server_args(files, config), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout=120)
        out = []
        for p in PROMPTS:
            r = httpx.post(url + "/completion", json=request(p), timeout=120)
            r.raise_for_status()
            j = r.json()
            out.append({"tokens": j["tokens"], "draft_n": j["timings"].get("draft_n"),
                        "draft_n_accepted": j["timings"].get("draft_n_accepted")})
        return out
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/spec_draft_greedy.json"))
    ap.add_argument("--port", type=int, default=8671)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        files = {name: write_variant(name, Path(d)) for name in variants()}
        out = {"reference": "llama-server b1-0c1e570", "command": " ".join(["python", *sys.argv]),
               "server_args": {c: server_args({"target": Path("TARGET"), "draft": Path("DRAFT")}, c) for c in CONFIGS},
               "request": request("PROMPT"), "prompts": PROMPTS,
               "sha256": {name: moe_ref.sha256(p) for name, p in files.items()},
               "results": {c: record(a.server, files, a.port, c) for c in CONFIGS}}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

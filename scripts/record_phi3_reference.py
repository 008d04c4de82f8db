#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random phi3 models into
tests/data/phi3_greedy.json (tests/test_phi3.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.PHI3_SPEC in
F32 and Q8_0, and a 256-dim Q4_K one), so that the tests regenerate the very same files (their
sha256 are recorded and checked) without the reference binary. Their `phi3.attention.sliding_window`
(16) is shorter than most of the sequences: llama.cpp b1-0c1e570 ignores it for phi3, and so must
tritium. Prompts, request and the two recorded configurations ("default": llama-server's float16
KV cache and flash attention; "f32attn": `-ctk f32 -ctv f32 -fa off`) are those of
scripts/record_moe_reference.py (its docstring says why both).

    python scripts/record_phi3_reference.py --server /work/lsb/llama-server \\
        --out tests/data/phi3_greedy.json
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from runtime.model.tiny_model import PHI3_SPEC, TinyModelSpec  # noqa: E402


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"f32": PHI3_SPEC, "q8_0": replace(PHI3_SPEC, wtype="q8_0"),
            "q4_k": replace(PHI3_SPEC, wtype="q4_k", n_embd=256, n_ff=512, n_head=4, n_head_kv=2, seed=6)}


def write_variant(name: str, out_dir: Path) -> Path:
    return moe_ref.write_spec("phi3", name, variants()[name], out_dir)


def main() -> int:
    return moe_ref.record_main(__doc__, "phi3_greedy.json", 8650, variants, write_variant)


if __name__ == "__main__":
    sys.exit(main())

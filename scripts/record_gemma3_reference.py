#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random gemma3 models into
tests/data/gemma3_greedy.json (tests/test_gemma3_tiny.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.GEMMA3_SPEC
in F32 and Q8_0, the Q8_0 one with an explicit `gemma3.rope.freq_base_swa` of 5000, and a 256-dim
Q4_K one), so that the tests regenerate the very same files (their sha256 are recorded and
checked) without the reference binary. Their sliding window (8) is shorter than every sequence but
one (prompt + 24 generated tokens), so the five local layers' window and RoPE base and the global
layer's are all exercised. Prompts, request and the two recorded configurations ("default":
llama-server's float16 KV cache and flash attention; "f32attn": `-ctk f32 -ctv f32 -fa off`) are
those of scripts/record_moe_reference.py (its docstring says why both).

    python scripts/record_gemma3_reference.py --server /work/lsb/llama-server \\
        --out tests/data/gemma3_greedy.json
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from runtime.model.tiny_model import GEMMA3_SPEC, TinyModelSpec  # noqa: E402


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"f32": GEMMA3_SPEC, "q8_0": replace(GEMMA3_SPEC, wtype="q8_0", rope_freq_base_swa=5000.0),
            "q4_k": replace(GEMMA3_SPEC, wtype="q4_k", n_embd=256, n_ff=512, head_dim=256, seed=8)}


def write_variant(name: str, out_dir: Path) -> Path:
    return moe_ref.write_spec("gemma3", name, variants()[name], out_dir)


def main() -> int:
    return moe_ref.record_main(__doc__, "gemma3_greedy.json", 8700, variants, write_variant)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random qwen35 / qwen35moe models into
tests/data/qwen35_greedy.json (tests/test_qwen35.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.QWEN35_SPEC in
F32 and Q8_0 and a 256-dim Q4_K one; QWEN35MOE_SPEC in F32 and Q8_0), so that the tests regenerate
the very same files (their sha256 are recorded and checked) without the reference binary. Prompts,
request and the two recorded configurations ("default": llama-server's float16 KV cache and flash
attention; "f32attn": `-ctk f32 -ctv f32 -fa off`) are those of scripts/record_moe_reference.py (its
docstring says why both). The linear-attention layers' state is float32 in both.

    python scripts/record_qwen35_reference.py --server /work/lsb/llama-server \\
        --out tests/data/qwen35_greedy.json
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from runtime.model.tiny_model import QWEN35MOE_SPEC, QWEN35_SPEC, TinyModelSpec  # noqa: E402


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"f32": QWEN35_SPEC, "q8_0": replace(QWEN35_SPEC, wtype="q8_0"),
            "q4_k": replace(QWEN35_SPEC, wtype="q4_k", n_embd=256, n_ff=512, seed=13),
            "moe-f32": QWEN35MOE_SPEC, "moe-q8_0": replace(QWEN35MOE_SPEC, wtype="q8_0")}


def write_variant(name: str, out_dir: Path) -> Path:
    spec = variants()[name]
    return moe_ref.write_spec(spec.arch, name, spec, out_dir)


def main() -> int:
    return moe_ref.record_main(__doc__, "qwen35_greedy.json", 8670, variants, write_variant)


if __name__ == "__main__":
    sys.exit(main())

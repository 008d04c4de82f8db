#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random gpt-oss models into
tests/data/gptoss_greedy.json (tests/test_gptoss.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.GPTOSS_SPEC with
its experts in MXFP4 and everything else F32, and all-F32), so that the tests regenerate the very same
files (their sha256 are recorded and checked) without the reference binary. Prompts, request and the two
recorded configurations are those of scripts/record_moe_reference.py. Recorded with llama-server
b1-0c1e570 built for AVX2 on an AVX2-only AMD EPYC (its float order: MXFP4's repacked GEMV, the
row-by-row flash attention with sinks).

    python scripts/record_gptoss_reference.py --server /work/lsb/llama-server
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from runtime.model.tiny_model import GPTOSS_SPEC, TinyModelSpec  # noqa: E402


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"mxfp4": replace(GPTOSS_SPEC, wtype="mxfp4"), "f32": GPTOSS_SPEC,
            # YaRN as the released models (factor 32 over 4096 there; 4 over 8 here, so that it acts)
            "yarn-mxfp4": replace(GPTOSS_SPEC, wtype="mxfp4", yarn_factor=4.0, rope_orig_ctx=8, seed=32)}


def write_variant(name: str, out_dir: Path) -> Path:
    spec = variants()[name]
    return moe_ref.write_spec(spec.arch, name, spec, out_dir)


def main() -> int:
    return moe_ref.record_main(__doc__, "gptoss_greedy.json", 8675, variants, write_variant)


if __name__ == "__main__":
    sys.exit(main())

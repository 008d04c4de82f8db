#!/usr/bin/env python3
"""Records llama-server's greedy tokens on the tiny random mistral3 models into
tests/data/mistral3_greedy.json (tests/test_mistral3.py compares tritium's with them).

The models are generated here, deterministically (`variants`: runtime.model.tiny_model.MISTRAL3_SPEC
in F32 and Q8_0, and an F32 one with YaRN and its log multiplier), so that the tests regenerate the very same files (their sha256 are recorded and
checked) without the reference binary. Prompts, request and the two recorded configurations are
those of scripts/record_moe_reference.py.

    python scripts/record_mistral3_reference.py --server /work/lsb/llama-server
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import record_moe_reference as moe_ref  # noqa: E402
from runtime.model.tiny_model import MISTRAL3_SPEC, TinyModelSpec  # noqa: E402


def variants() -> dict[str, TinyModelSpec]:
    """name -> the spec of one recorded model (all on the built-in vocabulary)."""
    return {"f32": MISTRAL3_SPEC, "q8_0": replace(MISTRAL3_SPEC, wtype="q8_0"),
            # YaRN (factor 4 over an original context of 8) with Ministral 3's log multiplier 1
            "yarn-f32": replace(MISTRAL3_SPEC, yarn_factor=4.0, yarn_log_mul=1.0, seed=24)}


def write_variant(name: str, out_dir: Path) -> Path:
    spec = variants()[name]
    return moe_ref.write_spec(spec.arch, name, spec, out_dir)


def main() -> int:
    return moe_ref.record_main(__doc__, "mistral3_greedy.json", 8673, variants, write_variant)


if __name__ == "__main__":
    sys.exit(main())

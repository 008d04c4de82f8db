#!/usr/bin/env python3
"""Write a tiny random vision-language pair: a text model GGUF and its --mmproj GGUF in llama.cpp's
layout (thin CLI over runtime.vision.tiny_mmproj; llama-server loads them with -m MODEL --mmproj MMPROJ).

    python scripts/make_tiny_mmproj.py --kind gemma3 --out-dir /tmp/vlm        # SigLIP, 16 tokens per image
    python scripts/make_tiny_mmproj.py --kind qwen25vl --out-dir /tmp/vlm      # Qwen2.5-VL, M-RoPE, window attention
    python scripts/make_tiny_mmproj.py --kind qwen3vl --out-dir /tmp/vlm --wtype f32
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.vision.tiny_mmproj import KINDS, write_pair  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=KINDS, required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wtype", choices=("f16", "f32"), default="f16", help="the mmproj's matrices")
    a = ap.parse_args(argv)
    model, mmproj = write_pair(a.out_dir, a.kind, a.seed, a.wtype)
    print(model)
    print(mmproj)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

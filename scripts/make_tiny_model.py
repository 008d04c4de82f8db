#!/usr/bin/env python3
"""Write a random-weight GGUF model (thin CLI over runtime.model.tiny_model).

The lesson's model:
    python scripts/make_tiny_model.py --vocab ../shared/vocab/ggml-vocab-qwen2.gguf \
        --out tiny-random-qwen2vocab-f32.gguf
The self-contained built-in model (small ChatML BPE vocabulary, 2 layers, 128 dims):
    python scripts/make_tiny_model.py --builtin --out tiny.gguf
The tests' tiny qwen3moe (runtime.model.tiny_model.MOE_SPEC: 2 layers, 8 experts, 2 used; the built-in
vocabulary unless --vocab is given):
    python scripts/make_tiny_model.py --arch qwen3moe --out tiny-qwen3moe.gguf [--type q8_0]
The tests' tiny phi3 (runtime.model.tiny_model.PHI3_SPEC: 2 layers, fused attn_qkv and gate+up ffn_up,
sliding window 16; the built-in vocabulary unless --vocab is given):
    python scripts/make_tiny_model.py --arch phi3 --out tiny-phi3.gguf [--type q8_0]
The tests' tiny gemma3 (runtime.model.tiny_model.GEMMA3_SPEC: 6 layers, 5 local with a window of 8 and
a global one, q/k norms and post-norms, tied output; the built-in vocabulary unless --vocab is given):
    python scripts/make_tiny_model.py --arch gemma3 --out tiny-gemma3.gguf [--type q8_0]
The tests' tiny gemma4 (runtime.model.tiny_model.GEMMA4_SPEC, E2B-like: per-layer inputs, the last 3
layers sharing KV, sliding heads of 32 and full heads of 64 with proportional RoPE, logit soft-cap):
    python scripts/make_tiny_model.py --arch gemma4 --out tiny-gemma4.gguf [--type q8_0]
The tests' tiny gpt-oss (runtime.model.tiny_model.GPTOSS_SPEC: 4 layers alternating a sliding window of 8
and global attention, attention sinks and biases, 8 biased experts with 4 used; experts in MXFP4 with
--type mxfp4, everything F32 with --type f32):
    python scripts/make_tiny_model.py --arch gpt-oss --type mxfp4 --out tiny-gpt-oss.gguf
The tests' tiny reranker (runtime.model.tiny_model.RERANK_SPEC: qwen3 with a Qwen3-Reranker's
cls.output yes/no head, RANK pooling and rerank template; the built-in vocabulary unless --vocab):
    python scripts/make_tiny_model.py --arch qwen3 --rerank --out tiny-reranker.gguf
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.model.tiny_model import (  # noqa: E402
    ARCHS, BUILTIN_SPEC, GEMMA3_SPEC, GEMMA4_SPEC, GPTOSS_SPEC, MOE_SPEC, PHI3_SPEC, RERANK_SPEC, WEIGHT_TYPES, TinyModelSpec, write_tiny_model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", "-o", required=True, help="output GGUF path")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--vocab", help="vocab-only GGUF whose tokenizer.* keys are copied")
    src.add_argument("--builtin", action="store_true",
                     help="built-in byte-level BPE vocabulary and the built-in (smaller) shape")
    ap.add_argument("--type", default="f32", choices=sorted(WEIGHT_TYPES), help="weight type")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--arch", choices=list(ARCHS))
    ap.add_argument("--layers", type=int)
    ap.add_argument("--embd", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--ff", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--experts", type=int, help="qwen3moe: experts per layer")
    ap.add_argument("--experts-used", type=int, help="qwen3moe: experts per token")
    ap.add_argument("--ff-exp", type=int, help="qwen3moe: FFN length of each expert")
    ap.add_argument("--sliding-window", type=int, help="phi3 / gemma3: attention.sliding_window (0: none)")
    ap.add_argument("--rope-base-swa", type=float, help="gemma3: rope.freq_base_swa (0: not written)")
    ap.add_argument("--rope-base", type=float)
    ap.add_argument("--rms-eps", type=float)
    ap.add_argument("--n-vocab", type=int, help="vocabulary rows when no vocabulary is given")
    ap.add_argument("--name", help="general.name")
    ap.add_argument("--tied", action="store_true", default=None,
                    help="tie the output matrix to the token embeddings (no output.weight)")
    ap.add_argument("--rerank", action="store_true", default=None,
                    help="qwen3: a reranker (RANK pooling, cls.output yes/no head, rerank chat template)")
    ap.add_argument("--random-blocks", action="store_true", default=None,
                    help="write quantized tensors as random valid GGUF blocks instead of quantizing "
                         "random floats (seconds instead of hours for an 8B shape)")
    a = ap.parse_args(argv)

    own = RERANK_SPEC if a.rerank else \
        {"qwen3moe": MOE_SPEC, "phi3": PHI3_SPEC, "gemma3": GEMMA3_SPEC, "gemma4": GEMMA4_SPEC, "gpt-oss": GPTOSS_SPEC}.get(a.arch)  # arch with its own tiny shape
    base = own or (BUILTIN_SPEC if a.builtin else TinyModelSpec())
    builtin = a.builtin or (own is not None and not a.vocab)
    overrides = dict(n_expert=a.experts, n_expert_used=a.experts_used, n_ff_exp=a.ff_exp, arch=a.arch, n_layer=a.layers, n_embd=a.embd, n_head=a.heads,
                     n_head_kv=a.kv_heads, head_dim=a.head_dim, n_ff=a.ff, n_ctx=a.ctx,
                     rope_freq_base=a.rope_base, sliding_window=a.sliding_window, rope_freq_base_swa=a.rope_base_swa, rms_eps=a.rms_eps, seed=a.seed,
                     n_vocab=a.n_vocab, name=a.name, tie_embeddings=a.tied, random_blocks=a.random_blocks,
                     rerank=a.rerank)
    spec = replace(base, wtype=a.type, **{k: v for k, v in overrides.items() if v is not None})
    t0 = time.perf_counter()
    out = write_tiny_model(a.out, spec, vocab="builtin" if builtin else a.vocab)
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1e6:.1f} MB, {spec.arch}, {spec.n_layer} layers, "
          f"{spec.n_embd} dims, {a.type}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

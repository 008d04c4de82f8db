#!/usr/bin/env python3
"""Grammar benchmark: compile time and per-step token-mask cost with the qwen2 vocabulary.

Prints JSON lines. Per-step cost is measured along random walks that sample uniformly among the
allowed tokens (biased toward closing tokens so that walks finish), as the sampler would call it:
`allowed_mask()` then `advance(token)`. "first" = steps whose state was never seen before (the
mask is computed), "all" = every step (cached states are a dictionary lookup).

usage: python scripts/bench_grammar.py [--vocab PATH] [--walks N] [--steps N]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grammar import JSON_OBJECT_GBNF, GrammarCompiler, Vocab, json_schema_to_gbnf  # noqa: E402

TYPICAL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"]},
        "created": {"type": "string", "format": "date-time"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    default_vocab = Path(__file__).resolve().parents[2] / "shared" / "vocab" / "ggml-vocab-qwen2.gguf"
    ap.add_argument("--vocab", default=str(default_vocab))
    ap.add_argument("--walks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()

    from runtime.tokenizer import load_tokenizer
    tok = load_tokenizer(args.vocab)
    pieces = tok.token_pieces()
    t0 = time.perf_counter()
    vocab = Vocab(pieces, set(tok.eot_ids) | {tok.eos_id})
    print(json.dumps({"what": "vocab", "n_vocab": vocab.n_vocab, "build_ms": 1e3 * (time.perf_counter() - t0)}))

    closing = frozenset(i for i, p in enumerate(pieces) if p in (b'"', b",", b"}", b"]", b'",', b'"}', b"0", b"1"))
    grammars = {
        "schema": json_schema_to_gbnf(TYPICAL_SCHEMA),
        "json_object": JSON_OBJECT_GBNF,
    }
    shared = Path(args.vocab).resolve().parents[1] / "grammars" / "json.gbnf"
    if shared.exists():
        grammars["json.gbnf"] = shared.read_text()

    for name, text in grammars.items():
        compiler = GrammarCompiler(vocab)
        t0 = time.perf_counter()
        t_conv = 0.0
        if name == "schema":
            t1 = time.perf_counter()
            json_schema_to_gbnf(TYPICAL_SCHEMA)
            t_conv = time.perf_counter() - t1
        cg = compiler.compile(text)
        compile_ms = 1e3 * (time.perf_counter() - t0)
        rng = random.Random(0)
        all_ms, first_ms, adv_ms = [], [], []
        seen: set[int] = set()
        finished = 0
        for _ in range(args.walks):
            m = cg.matcher()
            for _ in range(args.steps):
                new = m.state not in seen
                seen.add(m.state)
                t1 = time.perf_counter()
                mask = m.allowed_mask()
                dt = 1e3 * (time.perf_counter() - t1)
                all_ms.append(dt)
                if new:
                    first_ms.append(dt)
                ids = mask.nonzero().flatten().tolist()
                if rng.random() < 0.3:
                    pref = [t for t in ids if t in closing or t in vocab.eog_ids]
                    ids = pref or ids
                t = rng.choice(ids)
                t1 = time.perf_counter()
                m.advance(t)
                adv_ms.append(1e3 * (time.perf_counter() - t1))
                if m.finished:
                    finished += 1
                    break
        print(json.dumps({
            "what": "grammar", "grammar": name, "rules": len(text.splitlines()),
            "schema_to_gbnf_ms": 1e3 * t_conv, "compile_ms": compile_ms,
            "steps": len(all_ms), "walks_finished": finished,
            "mask_median_ms": statistics.median(all_ms), "mask_mean_ms": statistics.mean(all_ms),
            "mask_first_visit_median_ms": statistics.median(first_ms) if first_ms else 0.0,
            "mask_first_visit_max_ms": max(first_ms) if first_ms else 0.0,
            "advance_median_ms": statistics.median(adv_ms),
            "byte_states": cg.n_states,
        }))


if __name__ == "__main__":
    main()

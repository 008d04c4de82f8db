#!/usr/bin/env python3
"""Records llama-server's /tokenize and /detokenize on a gemma4-tokenizer vocabulary into
tests/data/gemma4_tokenizer.json (tests/test_gemma4.py compares tritium's tokenizer with them).

No Gemma 4 vocabulary is at hand, so one of its kind is derived (`vocab_keys`): the first 40,000
tokens of Gemma 3 270M's (their texts, scores and types; `<0xXX>` byte tokens, U+2581 for spaces)
with BPE merges ranked as SentencePiece ranks them (by the score of the merged token), written as
`tokenizer.ggml.model` "gemma4" (llama.cpp's SPM-style BPE: spaces escaped, lines split, raw UTF-8,
byte fallback, add_bos forced). The model is a tiny random gemma4 on it.

    python scripts/record_gemma4_tokenizer.py --server /work/lsb/llama-server
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from record_real_references import wait_ready  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

N_TOKENS = 40000
TEXTS = ["Hello world", " Hello  world", "Hello\n\nworld\n", "\n\n\n", "a\n\n\n\nb", "def f(x):\n    return x * 2\n",
         "héllo ünïcode 你好世界", "emoji 🦙🚀 end", "tabs\tand\r\nCRLF", "<bos>special<eos> text", "  leading spaces",
         "trailing   ", "The quick brown fox jumps over the lazy dog. 1234567890", "ｆｕｌｌｗｉｄｔｈ",
         "<start_of_turn>user\nhi<end_of_turn>"]


def vocab_keys(gemma3_path: Path) -> list:
    """The gemma4-kind tokenizer keys derived from Gemma 3 270M's vocabulary (see the docstring)."""
    import numpy as np
    from gguf import GGUFValueType as T

    from runtime.model.tiny_model import vocab_from_gguf
    from runtime.tokenizer.from_gguf import _spm_search

    keys = {k: v for k, v, _, _ in vocab_from_gguf(gemma3_path)}
    toks = list(keys["tokenizer.ggml.tokens"])[:N_TOKENS]
    scores = np.asarray(keys["tokenizer.ggml.scores"], dtype=np.float32)[:N_TOKENS]
    types = [int(t) for t in list(keys["tokenizer.ggml.token_type"])[:N_TOKENS]]
    ab = _spm_search({t: i for i, t in enumerate(toks)}, scores)
    merges = [f"{toks[a]} {toks[b]}" for a, b in ab.tolist() if " " not in toks[a] and " " not in toks[b]]
    return [("tokenizer.ggml.model", "gemma4", T.STRING, None), ("tokenizer.ggml.tokens", toks, T.ARRAY, T.STRING),
            ("tokenizer.ggml.scores", scores.tolist(), T.ARRAY, T.FLOAT32),
            ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32), ("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING),
            ("tokenizer.ggml.bos_token_id", 2, T.UINT32, None), ("tokenizer.ggml.eos_token_id", 1, T.UINT32, None),
            ("tokenizer.ggml.padding_token_id", 0, T.UINT32, None), ("tokenizer.ggml.add_space_prefix", False, T.BOOL, None),
            ("tokenizer.ggml.add_bos_token", False, T.BOOL, None)]


def main() -> int:
    import httpx

    from runtime.model.model_files import GEMMA, cached_path
    from runtime.model.tiny_model import GEMMA4_SPEC, write_tiny_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/gemma4_tokenizer.json"))
    ap.add_argument("--port", type=int, default=8742)
    a = ap.parse_args()
    spec = replace(GEMMA4_SPEC, n_embd_per_layer=0, gemma4_shared_kv=0, gemma4_double_mlp=False, n_embd=64,
                   head_dim=32, head_dim_swa=16, n_ff=64, wtype="f16", name="tiny-gemma4-vocab")
    with tempfile.TemporaryDirectory() as d:
        model = write_tiny_model(Path(d) / "m.gguf", spec, vocab=vocab_keys(cached_path(GEMMA)))
        proc = subprocess.Popen([a.server, "-m", str(model), "-c", "256", "--no-warmup", "--port", str(a.port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{a.port}"
        try:
            wait_ready(url, proc, timeout=120)
            cases = []
            for t in TEXTS:
                for add in (True, False):
                    toks = httpx.post(url + "/tokenize", json={"content": t, "add_special": add,
                                                               "parse_special": True}).json()["tokens"]
                    text = httpx.post(url + "/detokenize", json={"tokens": toks}).json()["content"]
                    cases.append({"text": t, "add_special": add, "tokens": toks, "detokenized": text})
        finally:
            proc.terminate()
            proc.wait()
    out = {"reference": "llama-server b1-0c1e570", "command": " ".join(["python", *sys.argv]), "n_tokens": N_TOKENS,
           "cases": cases}
    Path(a.out).write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

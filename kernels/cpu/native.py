"""Building and loading the C kernels (the `.c` files beside this module).

A `Library` names its C sources (compiled together into one shared object), its target and
optimization flags (default `-O3 -march=native`; a build for another instruction set names its
own, e.g. `("-O3", "-mavx2", "-mfma")`), extra flags and `-D` defines, and the C signatures of
the functions it exports. `load(library)` compiles it on first use with the system compiler
(OpenMP, position-independent) into `$TRITIUM_CACHE`, reuses that build afterwards and returns
the ctypes handle. It returns None, and callers use their
torch/BLAS paths, when TRITIUM_NO_CPU_KERNELS is set, without a compiler, or when the build or
the load fails; a failure is logged once, as a warning holding the tail of the compiler's stderr.

A build is reused only for the same sources (and headers), compiler, flags, defines and target:
the cache key hashes them together with what the compiler reports for those flags
(`cc <flags> -dM -E`: its version and the CPU features the flags enable, e.g. with -march=native).

`KERNELS` is the library the CPU kernel families live in (gemv.c, qgemv.c, attention.c, pointwise.c, mxfp4.c;
pool.c), built
once per instruction set (`kernels_library(isa)`: "avx512", "avx2" (+ FMA, F16C) or "scalar", the
portable C); `lib()` is the handle of `float_isa()`'s build, or None. `float_isa()`: the float
kernels' build of the one ISA ladder of the C kernels (`kernels.cpu.isa.level()`: the best this CPU
runs, or the level `TRITIUM_CPU_ISA` forces; qdot takes its build from the same level).
A new family adds its sources and signatures there, or makes a `Library`
of its own (e.g. one per instruction-set variant, with its `opt_flags` and `defines`) and calls
`load`, or `build` to compile one without loading it.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import env
from . import isa

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
OPT_FLAGS = ("-O3", "-march=native")
LINK_FLAGS = ("-fopenmp", "-shared", "-fPIC")
STDERR_TAIL_LINES = 30


@dataclass(frozen=True)
class Library:
    name: str  # the built file is <name>-<key>.so
    sources: tuple[str, ...]  # C files in `directory`, compiled into one shared object
    # function name -> (argtypes, restype), declared on the handle after loading
    signatures: dict = field(default_factory=dict, compare=False, hash=False)
    flags: tuple[str, ...] = ()  # extra compiler flags, e.g. ("-mno-avx512f",) to narrow the target
    defines: tuple[tuple[str, str], ...] = ()  # (NAME, VALUE) -> -DNAME=VALUE
    directory: Path = HERE  # where the sources (and the headers they include) are
    opt_flags: tuple[str, ...] = OPT_FLAGS  # target and optimization

    def compile_flags(self) -> list[str]:
        return [*self.opt_flags, *self.flags, *(f"-D{k}={v}" for k, v in self.defines), *LINK_FLAGS]


class BuildError(RuntimeError):
    pass


def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
        raise BuildError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return r.stdout


def build_key(library: Library, cc: str) -> str:
    """Hash of the sources and headers, the compiler, the flags and defines, and the target the
    compiler sees for those flags."""
    h = hashlib.sha256()
    files = [library.directory / s for s in library.sources] + sorted(library.directory.glob("*.h"))
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    flags = library.compile_flags()
    target = _run([cc, *flags, "-dM", "-E", "-x", "c", os.devnull], "asking the compiler for its target")
    h.update("\0".join([cc, *flags, target]).encode())
    return h.hexdigest()[:16]


def build(library: Library) -> Path | None:
    """The compiled shared object of `library` (built now unless cached); None without a compiler.
    Raises BuildError (with the compiler's stderr tail) when compiling fails."""
    cc = env.c_compiler()
    if cc is None:
        log.info("no C compiler found (gcc, cc or $CC): %s not built, the torch paths are used", library.name)
        return None
    out = env.cache_dir() / f"{library.name}-{build_key(library, cc)}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        so = Path(tmp) / out.name
        flags = library.compile_flags()
        objs = [str(Path(tmp) / f"{i}-{Path(s).stem}.o") for i, s in enumerate(library.sources)]
        jobs = [[cc, *flags, "-c", str(library.directory / s), "-o", o] for s, o in zip(library.sources, objs)]
        # one compiler per source file, as many at once as there are cores (the same translation
        # units a single `cc a.c b.c` makes; the link is the same)
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
            list(pool.map(lambda cmd: _run(cmd, f"compiling {library.name}"), jobs))
        _run([cc, *flags, *objs, "-o", str(so), "-lm"], f"linking {library.name}")
        os.replace(so, out)  # atomic: concurrent builders see a whole file or none
    return out


_lock = threading.Lock()
_loaded: dict[Library, ctypes.CDLL | None] = {}


def load(library: Library) -> ctypes.CDLL | None:
    """The loaded library with its signatures declared, or None (see the module docstring). Built
    and loaded once per process and `library`; a failure is logged on that first try only."""
    with _lock:
        if library in _loaded:
            return _loaded[library]
        handle = None
        if not env.cpu_kernels_disabled():
            try:
                path = build(library)
                if path is not None:
                    handle = ctypes.CDLL(str(path))
                    for fn, (argtypes, restype) in library.signatures.items():
                        getattr(handle, fn).argtypes = argtypes
                        getattr(handle, fn).restype = restype
            except (BuildError, OSError, AttributeError) as e:
                log.warning("CPU kernels (%s) unavailable, the torch paths are used instead: %s", library.name, e)
                handle = None
        _loaded[library] = handle
        return handle


_i, _l, _f, _p = ctypes.c_int, ctypes.c_long, ctypes.c_float, ctypes.c_void_p
_BGEMV = ([_p, _p, _p, _p, _i, _i, _i, _i, _l, _i], None)
_QGEMV = ([_p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _l, _i], None)
KERNELS = Library("cpu_kernels", ("gemv.c", "qgemv.c", "attention.c", "fattn.c", "pool.c", "pointwise.c",
                                   "linear_attn.c", "mxfp4.c", "kv_quant.c"), {
    # gemv.c (kernels/cpu/gemv.py)
    "bgemv_tiles64": _BGEMV, "bgemv_tiles64_f16": _BGEMV, "bgemv_tiles64_bf16": _BGEMV,
    "i8_widening_is_vectorized": ([], _i), "cpu_kernels_isa": ([], ctypes.c_char_p),
    "head_scan_i8": ([_p, _p, _p, _p, _p, _i, _i, _i, _l, _i], None),
    "pack_i8_f32": ([_p, _p, _p, _p, _p, _i, _i, _i], None),
    # qgemv.c (kernels/cpu/qgemv.py)
    "qgemv_tiles64_c8": _QGEMV, "qgemv_tiles64_c4": _QGEMV,
    # attention.c (kernels/cpu/attention.py)
    "paged_decode": ([_p, _p, _p, _p, _i, _p, _p, _p, _i, _i, _i, _i, _i, _i, _f, _f, _i, _i, _i], None),
    "paged_decode_team": ([_p, _p, _p, _p, _i, _p, _p, _p, _i, _i, _i, _i, _i, _i, _f, _f, _i, _i, _i], None),
    # fattn.c (kernels/cpu/attention.py)
    "fattn_rows": ([_p, _p, _p, _p, _i, _p, _p, _i, _i, _i, _i, _i, _f, _f, _i, _i, _i, _i], None),
    "fattn_rows_sinks": ([_p, _p, _p, _p, _i, _p, _p, _i, _i, _i, _i, _i, _f, _f, _i, _i, _i, _i, _p], None),
    "fattn_tiled_seq": ([_p, _p, _p, _p, _i, _i, _p, _i, _i, _i, _i, _f, _i, _i, _i, _i, _i], _i),
    # pointwise.c (kernels/cpu/pointwise.py)
    "add_rms_norm_f32": ([_p, _p, _p, _p, _p, _i, _i, _f, _i], None),
    "rope_f32": ([_p, _p, _p, _p, _i, _i, _i, _i, _i, _f, _f, _i], None),
    "write_kv_f32": ([_p, _p, _p, _p, _p, _i, _i, _i, _l], _l),
    "swiglu_f32": ([_p, _p, _p, _l, _l, _l, _l, _i, _i], None),
    "swiglu_f32_avx2": ([_p, _p, _p, _l, _l, _l, _l, _i, _i], None),
    "gelu_table_mul_f32": ([_p, _p, _p, _p, _l, _l, _l, _l, _i, _i], None),
    "qkv_rope_store_f32": ([_p, _l, _p, _p, _p, _f, _p, _p, _i, _i, _f, _f, _i, _i, _i, _i, _p, _p, _p, _p, _i, _l], _l),
    # linear_attn.c (kernels/cpu/linear_attn.py)
    "ssm_conv_f32": ([_p, _l, _p, _p, _p, _p, _p, _i, _i, _i, _i], None),
    "gdn_f32": ([_p, _p, _p, _p, _p, _p, _p, _p, _p, _i, _i, _i, _i, _i, _i], _i),
    "gdn_gates_f32": ([_p, _l, _p, _l, _p, _p, _p, _p, _i, _i], None),
    "sigmoid_f32": ([_p, _p, _l], None),
    # mxfp4.c (kernels/cpu/mxfp4.py)
    "mxfp4_q8_0_matmul": ([_p, _l, _i, _i, _p, _p, _i, _p, _l, _i], None),
    "swiglu_oai_f32": ([_p, _p, _p, _l, _f, _f], None),
    "softmax_small_f32": ([_p, _i, _i], None),
    # kv_quant.c (kernels/cpu/kv_quant.py)
    "kvq_attention_rows": ([_p, _p, _p, _p, _i, _p, _p, _i, _i, _i, _i, _i, _f, _f, _i, _i, _i, _i, _i, _p], _i),
    "kvq_quantize": ([_p, _p, _l, _i, _i], _i),
    "kvq_dequantize": ([_p, _p, _l, _i, _i], _i),
    "kvq_vec_dot": ([_p, _p, _p, _l, _i, _i], _i),
    "kvq_write": ([_p, _p, _p, _i, _i, _i, _i], None),
    "f32_matmul_ggml_avx2": ([_p, _l, _i, _i, _p, _l, _i, _p, _l, _i], None),
})


# Builds of KERNELS per instruction set (the /proc/cpuinfo flags each needs: isa.FLOAT_CPU_FLAGS)
ISA_OPT_FLAGS = {
    "avx512": ("-O3", "-mtune=native", "-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl"),
    "avx2": ("-O3", "-mtune=native", "-mavx2", "-mfma", "-mf16c"),
    "scalar": ("-O3",),
}
cpu_flags = isa.cpu_flags


@functools.cache
def supported_isas() -> tuple[str, ...]:
    """The builds of KERNELS this CPU runs, best first."""
    return tuple(b for b in ISA_OPT_FLAGS if isa.runs(isa.FLOAT_CPU_FLAGS[b]))


def ggml_vector_order() -> str | None:
    """The vector branch of vec.h (ggml_v_expf and the sums beside it: SwiGLU, the soft-max of tiled
    attention) that llama.cpp's CPU build for this machine compiles: "avx512" (AVX-512F + DQ, 16
    lanes), "avx2" (AVX2 + FMA, 8 lanes), or None (another CPU: tritium's reference paths)."""
    flags = cpu_flags()
    if {"avx512f", "avx512dq"} <= flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else None


def float_isa() -> str:
    """The build of KERNELS to use: that of `isa.level()` (TRITIUM_CPU_ISA, else the best this CPU
    runs; a forced level the CPU cannot run is a ValueError)."""
    return isa.float_build()


def kernels_library(build_isa: str) -> Library:
    """KERNELS built for `build_isa` (a key of ISA_OPT_FLAGS)."""
    return replace(KERNELS, name=f"cpu_kernels-{build_isa}", opt_flags=ISA_OPT_FLAGS[build_isa],
                   flags=("-Wno-psabi",))


@functools.cache
def _lib_for(build_isa: str) -> ctypes.CDLL | None:
    return load(kernels_library(build_isa))


def lib() -> ctypes.CDLL | None:
    """The handle of KERNELS for `float_isa()` (None: use the torch paths). Cheap: the kernels call
    it per op."""
    return _lib_for(float_isa())

"""The integer-dot kernels' compiled library and the sizes of their panel layout, without torch
(`qdot.py` holds the torch-facing calls and re-exports these; `prepack.py` repacks GGUF matrices
through this module before torch is imported). ISA builds and the layout: `qdot.py`'s docstring."""
from __future__ import annotations

import ctypes
import functools
import logging
import platform

from . import native
from .isa import QDOT_CPU_FLAGS, qdot_build, runs

log = logging.getLogger("kernels.cpu.qdot")

_SOURCES = ("qdot_repack.c", "qdot_panel.c", "qdot_quant.c", "qdot_sched.c", "qdot_route.c", "qdot_gemm.c",
            "qdot_mk_avx2.c", "qdot_mk_avx512.c", "qdot_portable.c", "qdot_exact.c")

_AVX2 = ("-mavx2", "-mfma", "-mf16c", "-mbmi2")
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx512vnni": _AVX2 + ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
    "avxvnni": _AVX2 + ("-mavxvnni",),
    "avx2": _AVX2,
    "vnni-emu": _AVX2,
    "scalar": (),
}
_ISA_DEFINES = {"vnni-emu": (("QDOT_EMULATE_VNNI", "1"),)}

# GGML type id -> (block size, type size, activation kind)
TYPES = {
    2: (32, 18, "q8_0"), 3: (32, 20, "q8_0"), 6: (32, 22, "q8_0"), 7: (32, 24, "q8_0"), 8: (32, 34, "q8_0"),
    10: (256, 84, "q8_K"), 11: (256, 110, "q8_K"), 12: (256, 144, "q8_K"), 13: (256, 176, "q8_K"),
    14: (256, 210, "q8_K"),
}
_CODES_SCALES = {2: (128, 16), 3: (128, 32), 6: (160, 16), 7: (160, 32), 8: (256, 16), 10: (512, 160),
                 11: (768, 112), 12: (1024, 128), 13: (1280, 128), 14: (1536, 144)}


def supported_isas() -> list[str]:
    """The builds this CPU can run, best first (x86 only; elsewhere just "scalar")."""
    return [b for b in ISA_FLAGS if runs(QDOT_CPU_FLAGS[b])]


def current_isa() -> str:
    """qdot's build of the one ISA ladder (`kernels.cpu.isa.level()`: TRITIUM_CPU_ISA if set, else
    the best this CPU runs; vnni-emu is never chosen by default; a forced level this CPU cannot run
    is a ValueError)."""
    return qdot_build()


GROUP_MAX = 8


class _GroupStruct(ctypes.Structure):
    _fields_ = [("nw", ctypes.c_int), ("K", ctypes.c_int), ("types", ctypes.c_int * GROUP_MAX),
                ("Ns", ctypes.c_int * GROUP_MAX), ("Ws", ctypes.c_void_p * GROUP_MAX), ("exact", ctypes.c_int)]


_i, _l, _p = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
_SIGNATURES = {
    "qd_repack": ([_i, _p, _l, _i, _i, _p, _i], _i),
    "qd_repack_many": ([_i, _p, _p, _p, _p, _p, _p, _i, _i], _i),
    "qd_repacked_bytes": ([_i, _i, _i], ctypes.c_size_t),
    "qd_matmul": ([_i, _p, _i, _i, _p, _p, _p, _p, _p, _i, _p, _l, _i, _i], _i),
    "qd_quantize_q8_0": ([_p, _l, _i, _i, _p, _p, _p, _p, _i], None),
    "qd_quantize_q8_K": ([_p, _l, _i, _i, _p, _p, _p, _i], None),
    "qd_dequant_rows": ([_i, _p, _i, _i, _p, _i, _p, _i], None),
    "qd_isa_level": ([], _i),
    "qd_group_run": ([_p, _p, _l, _i, _p, _l, _i], _i),
    "qd_release": ([_p, ctypes.c_size_t], _i),
    "qd_group_size": ([], _i),
    "qd_route": ([_i, _i, _i, _i], _i),
    "qd_route_odd": ([_i, _i, _i], _i),
    "qd_kernel_name": ([_i], ctypes.c_char_p),
    "qd_kernel_file": ([_i], ctypes.c_char_p),
    "qd_kernel_pair": ([_i], _i),
}


@functools.cache
def library(isa: str) -> native.Library:
    """The `native.Library` of one ISA variant (its own build in $TRITIUM_CACHE; the repacked
    layout is the same for every ISA)."""
    opt = ["-O3", "-std=gnu11", "-ffp-contract=off", *ISA_FLAGS[isa]]
    if isa != "scalar" and platform.machine().lower() in ("x86_64", "amd64"):
        opt.insert(1, "-mtune=native")
    return native.Library(f"qdot-{isa}", _SOURCES, _SIGNATURES, defines=_ISA_DEFINES.get(isa, ()),
                          opt_flags=tuple(opt))


def build(isa: str):
    """Compile (or find in the cache) the shared library of `isa` without loading it: any ISA can be
    built on any x86-64 machine (tests build the VNNI variants this CPU cannot run). None without a
    compiler or when the build fails (logged)."""
    try:
        return native.build(library(isa))
    except native.BuildError as e:
        log.warning("qdot: building the %s kernels failed: %s", isa, e)
        return None


def lib(isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels for `isa` (default `current_isa()`), or None (no compiler, a failed
    build, TRITIUM_NO_CPU_KERNELS, or a C/Python layout mismatch)."""
    handle = native.load(library(isa or current_isa()))
    if handle is not None and handle.qd_group_size() != ctypes.sizeof(_GroupStruct):
        log.warning("qdot: qd_group layout mismatch between C and Python; kernels unavailable")
        return None
    return handle


def available() -> bool:
    return lib() is not None


def _lib() -> ctypes.CDLL:
    lb = lib()
    if lb is None:
        raise RuntimeError("qdot kernels unavailable (no compiler, or the build failed; see the log)")
    return lb


def act_kind(qtype: int) -> str:
    """"q8_0" or "q8_K": the activation quantization weights of `qtype` read."""
    return TYPES[int(qtype)][2]


def groupable(members: list[tuple[int, int]]) -> bool:
    """Whether matrices of these (GGML type, cols) make one qdot group: 1..GROUP_MAX of them, one
    width, every type one qdot has and the width a multiple of its block (`matmul.prepare_weights`
    and `prepack.prepack` both ask this)."""
    return (1 <= len(members) <= GROUP_MAX and len({c for _, c in members}) == 1
            and all(int(t) in TYPES and c % TYPES[int(t)][0] == 0 for t, c in members))


def repacked_bytes(qtype: int, rows: int, cols: int) -> int:
    bs, _, _ = TYPES[int(qtype)]
    c, s = _CODES_SCALES[int(qtype)]
    nb = cols // bs
    panel = nb * (s + c)  # per block: scale fields, then codes (qdot.h)
    return ((rows + 7) // 8) * ((panel + 63) // 64 * 64)

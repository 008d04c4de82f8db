"""The one instruction-set ladder of the C kernels: which build of each library a process runs.

Each C library of kernels/cpu is compiled once per instruction set: the float kernels
(`native.KERNELS`: gemv.c, qgemv.c, attention.c, fattn.c, pointwise.c; builds "avx512", "avx2",
"scalar") and qdot (`qdot_lib`: "avx512vnni", "avxvnni", "avx2", "vnni-emu", "scalar"). `level()`
is the one decision: the rung of the ladder below that this process runs, and every library takes
its build of that rung (`float_build()`, `qdot_build()`):

| level | float kernels | qdot | the CPU needs (/proc/cpuinfo) |
| --- | --- | --- | --- |
| avx512vnni | avx512 | avx512vnni | AVX2 FMA F16C BMI2, AVX-512 F BW VL VNNI |
| avx512 | avx512 | avx2 | AVX2 FMA F16C BMI2, AVX-512 F BW VL |
| avxvnni | avx2 | avxvnni | AVX2 FMA F16C BMI2, AVX-VNNI |
| avx2 | avx2 | avx2 | AVX2 FMA F16C BMI2 |
| vnni-emu | avx2 | vnni-emu (qdot's VNNI code paths with vpdpbusd emulated on AVX2: tests; never the default) | as avx2 |
| scalar | scalar | scalar | nothing (the portable C; the only level off x86-64) |

`TRITIUM_CPU_ISA` (read through `kernels.env.cpu_isa`, when asked, so tests can set it) forces a
level; by default the best this CPU runs. A forced level the CPU cannot run is an error (it would die
on an illegal instruction), and so is an unknown one. qdot's C code has the same ladder as the
`isa` of its router (`qd_route`, kernels/cpu/qdot_route.c: `QDOT_ROUTE_LEVEL`).
"""
from __future__ import annotations

import functools
import platform
from typing import NamedTuple

from .. import env

_AVX2 = frozenset({"avx2", "fma", "f16c"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl"}
# /proc/cpuinfo flags each build needs: the float kernels' (native.ISA_OPT_FLAGS) ...
FLOAT_CPU_FLAGS = {"avx512": _AVX512, "avx2": _AVX2, "scalar": frozenset()}
# ... and qdot's (qdot_lib.ISA_FLAGS)
QDOT_CPU_FLAGS = {
    "avx512vnni": _AVX512 | {"bmi2", "avx512_vnni"},
    "avxvnni": _AVX2 | {"bmi2", "avx_vnni"},
    "avx2": _AVX2 | {"bmi2"},
    "vnni-emu": _AVX2 | {"bmi2"},
    "scalar": frozenset(),
}
# qdot's build -> the `isa` level of its C router (qdot.h QD_ISA_*)
QDOT_ROUTE_LEVEL = {"scalar": 0, "avx2": 1, "avxvnni": 2, "vnni-emu": 2, "avx512vnni": 3}


class Level(NamedTuple):
    name: str
    float: str  # the float kernels' build
    qdot: str  # qdot's build
    default: bool = True  # chosen when this CPU runs it and nothing above it (vnni-emu: only forced)

    @property
    def cpu_flags(self) -> frozenset[str]:
        return FLOAT_CPU_FLAGS[self.float] | QDOT_CPU_FLAGS[self.qdot]


LADDER = (  # best first
    Level("avx512vnni", "avx512", "avx512vnni"),
    Level("avx512", "avx512", "avx2"),
    Level("avxvnni", "avx2", "avxvnni"),
    Level("avx2", "avx2", "avx2"),
    Level("vnni-emu", "avx2", "vnni-emu", default=False),
    Level("scalar", "scalar", "scalar"),
)
LEVELS = {lv.name: lv for lv in LADDER}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((frozenset(ln.split(":", 1)[1].split()) for ln in f if ln.startswith("flags")), frozenset())
    except OSError:
        return frozenset()


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def runs(flags_needed: frozenset[str]) -> bool:
    """Whether this CPU runs code needing these flags (off x86-64: only the portable builds)."""
    return not flags_needed if not _x86() else flags_needed <= cpu_flags()


@functools.cache
def _level(forced: str) -> Level:
    if not forced:
        return next(lv for lv in LADDER if lv.default and runs(lv.cpu_flags))
    if forced not in LEVELS:
        raise ValueError(f"TRITIUM_CPU_ISA={forced!r}: expected one of {sorted(LEVELS)}")
    lv = LEVELS[forced]
    if not runs(lv.cpu_flags):
        runnable = [v.name for v in LADDER if runs(v.cpu_flags)]
        raise ValueError(f"TRITIUM_CPU_ISA={forced!r}: this CPU cannot run the {lv.float} kernels / the "
                         f"{lv.qdot} qdot kernels (it runs {', '.join(runnable)})")
    return lv


def level() -> Level:
    """The level this process runs: forced by TRITIUM_CPU_ISA, else the best this CPU runs. Cheap
    (the kernels ask per op)."""
    return _level(env.cpu_isa())


def float_build() -> str:
    return level().float


def qdot_build() -> str:
    return level().qdot

"""Compile one Triton kernel variant for a CUDA target without a GPU and read its machine code:
the helpers of `scripts/gpu_model.py`.

`compile_variant(jit, args, kwargs, arch)` compiles through `aot_compile.CompileOnlyDriver` (the
wheel's ptxas makes the cubin) and returns a `Compiled` (registers and spills from `ptxas -v`,
shared memory from the metadata, the SASS from the wheel's `nvdisasm`). `analyze(sass)` finds the
kernel's main loop (the backward branch whose body holds the most instructions) and counts, per
iteration and outside it: all instructions, global loads (instructions and bytes, by width),
shared-memory traffic, tensor-core instructions, integer dot products and conversions.
"""
from __future__ import annotations

import io
import contextlib
import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import triton

import aot_compile

# bytes moved by one global load, by the opcode's width suffix (LDG.E = 32 bits); LDGSTS is
# Ampere's asynchronous global->shared copy, UTMALDG Hopper's bulk tensor copy (counted, size n/a)
_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+):")


@dataclass
class Section:
    """Counts over a run of instructions (per thread, each executed once)."""
    instructions: int = 0
    ldg: int = 0  # global load instructions (LDG, LDGSTS)
    ldg_bytes: int = 0
    ldg_widths: Counter = field(default_factory=Counter)  # bytes per load -> count
    shared: int = 0  # LDS/STS/LDSM/STSM
    mma: int = 0  # HMMA / HGMMA / IMMA
    dp4a: int = 0  # IDP4A / IDP.4A
    convert: int = 0  # I2F / F2I / I2FP / F2IP (slow-path conversions)
    barriers: int = 0
    ops: Counter = field(default_factory=Counter)

    def add(self, op: str, full: str) -> None:
        if op == "NOP":
            return
        self.instructions += 1
        self.ops[op] += 1
        if op in ("LDG", "LDGSTS"):
            self.ldg += 1
            parts = full.split(".")
            width = next((_WIDTH[p] for p in parts[1:] if p in _WIDTH), 4)
            self.ldg_widths[width] += 1
            self.ldg_bytes += width
        elif op in ("LDS", "STS", "LDSM", "STSM"):
            self.shared += 1
        elif op in ("HMMA", "HGMMA", "IMMA", "IGMMA", "QGMMA"):
            self.mma += 1
        elif op in ("IDP", "IDP4A"):
            self.dp4a += 1
        elif op in ("I2F", "F2I", "I2FP", "F2IP", "I2I"):
            self.convert += 1
        elif op in ("BAR", "WARPSYNC", "SYNCS"):
            self.barriers += 1


@dataclass
class SassStats:
    loop: Section  # one iteration of the main loop
    outside: Section  # everything else, once per program
    n_loops: int  # backward branches found
    total: int  # static instructions


def analyze(sass: str) -> SassStats:
    instrs: list[tuple[int, str, str, str]] = []  # (address, opcode, full opcode, operands)
    labels: dict[str, int] = {}
    pending: list[str] = []
    for line in sass.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _LINE.match(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        for lab in pending:
            labels[lab] = addr
        pending = []
        full = m.group(3)
        instrs.append((addr, full.split(".")[0], full, m.group(4)))
    loops = []
    for addr, op, _, operands in instrs:
        if op == "BRA":
            t = re.search(r"(\.L_x_\d+)", operands)
            if t and t.group(1) in labels and labels[t.group(1)] < addr:  # not the trailing BRA-to-self trap
                loops.append((labels[t.group(1)], addr))
    best = max(loops, key=lambda lo: sum(1 for a, o, *_ in instrs if lo[0] <= a <= lo[1] and o != "NOP"),
               default=None)
    loop, outside = Section(), Section()
    for addr, op, full, _ in instrs:
        (loop if best and best[0] <= addr <= best[1] else outside).add(op, full)
    return SassStats(loop, outside, len(loops), loop.instructions + outside.instructions)


def _tool(name: str) -> str:
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if path.exists():
        return str(path)
    for alt in (f"/usr/local/cuda/bin/{name}", f"/usr/local/bin/{name}"):
        if os.path.exists(alt):
            return alt
    raise FileNotFoundError(f"{name}: not in the triton wheel nor /usr/local/cuda")


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        p = subprocess.run([_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True)
        return p.stdout
    finally:
        os.unlink(f.name)


@dataclass
class Compiled:
    name: str
    arch: int
    registers: int
    spill_stores: int
    spill_loads: int
    smem: int
    num_warps: int
    mma: str  # "wgmma" | "mma" | "-" (from the PTX)
    stats: SassStats
    error: str = ""


_ARCH: list[int] = []


def compile_variant(jit, args: tuple, kwargs: dict, arch: int) -> Compiled:
    """Compile for sm_`arch` with the compile-only driver; measure it."""
    if _ARCH != [arch]:
        triton.runtime.driver.set_active(aot_compile.CompileOnlyDriver(arch))
        _ARCH[:] = [arch]
    jit.device_caches.clear()
    knobs = getattr(triton, "knobs", None)
    out = io.StringIO()
    if knobs is not None and hasattr(knobs.nvidia, "dump_ptxas_log"):
        knobs.nvidia.dump_ptxas_log = True
    with contextlib.redirect_stdout(out):
        k = jit.warmup(*args, grid=(1,), **kwargs)
    ptx = k.asm["ptx"]
    usage = aot_compile._ptxas_usage(out.getvalue()) or aot_compile._ptxas_usage(aot_compile._run_ptxas(ptx, arch))
    regs, st, ld = usage if usage else (-1, -1, -1)
    md = k.metadata
    smem = int(md.shared if hasattr(md, "shared") else md["shared"])
    warps = int(md.num_warps if hasattr(md, "num_warps") else md["num_warps"])
    mma = "wgmma" if "wgmma.mma_async" in ptx else ("mma" if "mma.sync" in ptx else "-")
    return Compiled(jit.__name__, arch, regs, st, ld, smem, warps, mma, analyze(disassemble(k.asm["cubin"])))

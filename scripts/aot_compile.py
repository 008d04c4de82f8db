"""Compile every Triton kernel of `kernels/triton` for CUDA targets without a GPU, and check the
resources each variant needs.

A fake driver reports device 0, stream 0 and `GPUTarget("cuda", arch, 32)`
(`triton.runtime.driver.set_active`); the launches are those the dispatch layer really makes
(`kernels/triton/aot_cases.py` calls the ops on CPU tensors of the supported models' shapes, the
kernel launches are intercepted, autotuned kernels give every config left after pruning), and each
distinct variant is compiled with `JITFunction.warmup` in a process pool; the wheel's own `ptxas`
makes the cubin. Registers and spills come from `ptxas -v`, shared memory from the compiled
kernel's metadata, the MMA kind from the PTX (`wgmma` on sm_90, `mma.sync` on sm_80).

Fails (exit 1) on a compile error, on spills above `--spill-budget` bytes, on shared memory over
the target's per-block limit, on registers over `MAX_REGS` (decode attention: 128; over a quantized
KV cache `MAX_REGS_QUANT_KV`, 192), or on a
kernel no case reaches. Prints a table per target
(kernel, variants, registers, spills, shared memory, MMA) and writes the per-variant rows with
`--json`.

    python scripts/aot_compile.py                    # every variant, sm_90 and sm_80
    python scripts/aot_compile.py --quick            # CI: the resource-bounding subset, sm_90
    python scripts/aot_compile.py --list             # the variants only, nothing compiled
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.driver import DriverBase  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

# shared memory per block (opt-in maximum), bytes
SMEM_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
SPILL_BUDGET = 0  # bytes of spill stores allowed per variant (default)
# registers per thread allowed, per kernel (default): decode attention within 128 (4 warps: 4 blocks per SM;
# issue 32), under every triton this runs with (CI: 3.9 in the tests, 3.6.0 the GPU machine's in .ci/run)
MAX_REGS = {"_paged_decode_kernel": 128}
# over a quantized KV cache (K_TYPE / V_TYPE set: the tiles dequantized in registers), head dim 256
# on 8 warps: 188-190 registers under triton 3.6 (<= 126 under 3.9), one block per SM, no spills
MAX_REGS_QUANT_KV = {"_paged_decode_kernel": 192}


class CompileOnlyDriver(DriverBase):
    """Enough of a CUDA driver for `JITFunction.warmup` on a machine without a GPU."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        raise RuntimeError("compile-only driver: nothing can run")

    def get_empty_cache_for_benchmark(self):
        raise RuntimeError("compile-only driver: nothing can run")

    def clear_cache(self, cache):
        pass


@dataclass(frozen=True)
class Ptr:
    """A tensor argument as the compiler sees it: element type and 16-byte alignment."""
    dtype: torch.dtype
    aligned: bool = True

    def data_ptr(self):
        return 0 if self.aligned else 8


def _spec(v, exact: bool = False):
    """What of a runtime argument makes another variant: triton specializes ints on == 1 (a
    constant) and on divisibility by 16 (`exact` only: that changes address arithmetic and
    vector widths, not tiles, so by default one such variant stands for all), pointers on
    alignment."""
    if isinstance(v, Ptr):
        return ("*", str(v.dtype), v.aligned if exact else True)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v == 1, v % 16 == 0 if exact else None, -(2**31) <= v < 2**31)
    if isinstance(v, float):
        return ("f",)
    return ("c", repr(v))


def _arg(v):
    if isinstance(v, torch.Tensor):
        return Ptr(v.dtype, v.data_ptr() % 16 == 0)
    if isinstance(v, torch.dtype):
        return Ptr(v)
    return v


@dataclass
class Variant:
    kernel: str  # "module._name_kernel"
    args: tuple
    kwargs: dict
    case: str  # the first case that launched it

    def key(self, exact: bool = False):
        """Runtime arguments by what the compiler specializes on; constexprs (always passed by
        keyword here, see `collect`) and options by value."""
        return (self.kernel, tuple(_spec(a, exact) for a in self.args),
                tuple(sorted((k, _spec(v, exact) if isinstance(v, Ptr) else repr(v)) for k, v in self.kwargs.items())))

    def label(self):
        kw = " ".join(f"{k}={v}" for k, v in sorted(self.kwargs.items()) if not isinstance(v, Ptr))
        dts = ",".join(sorted({str(a.dtype)[6:] for a in self.args if isinstance(a, Ptr)}))
        return f"{kw} [{dts}]"


def _name_of(fn, names: dict[int, str]) -> str:
    while id(fn) not in names and hasattr(fn, "fn"):
        fn = fn.fn
    return names.get(id(fn), getattr(fn, "__name__", repr(fn)))


def collect(quick: bool, families: list[str] | None = None, exact: bool = False, shapes: tuple = (),
            acts: tuple = ()) -> tuple[list[Variant], dict[str, object]]:
    """Run every case with the launches intercepted; the distinct variants, first case each."""
    from kernels.triton import aot_cases

    scope = aot_cases.Scope(quick, tuple(shapes), tuple(getattr(torch, a) for a in acts))
    kernels = aot_cases.kernels()
    names = {}
    for n, k in kernels.items():
        while True:
            names[id(k)] = n
            if isinstance(k, JITFunction) or not hasattr(k, "fn"):
                break
            k = k.fn
    seen: dict[tuple, Variant] = {}
    current = [""]

    def jit_run(self, *args, grid=None, warmup=False, **kwargs):
        # constexprs by keyword, so that the variant key compares them by value
        n_pos = len(args)
        for p in self.params[:n_pos]:
            if p.is_constexpr:
                kwargs[p.name] = args[p.num]
        args = tuple(a for p, a in zip(self.params, args) if not p.is_constexpr)
        v = Variant(_name_of(self, names), tuple(_arg(a) for a in args),
                    {k: _arg(x) for k, x in kwargs.items() if k not in ("debug",)}, current[0])
        seen.setdefault(v.key(exact), v)

    def tuner_run(self, *args, **kwargs):
        kwargs.pop("warmup", None)
        grid = kwargs.pop("grid", None)
        self.nargs = dict(zip(self.arg_names, args))
        try:
            configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs
        finally:
            self.nargs = None
        for c in configs:
            self.fn.run(*args, grid=grid, warmup=True, **kwargs, **c.all_kwargs())

    def every_config(self, key, meta, device, run):  # kernels.triton.tuning: all candidates
        for c in self.candidates(meta):
            run(c)

    from kernels.triton.tuning import Tuner

    saved = (JITFunction.run, Autotuner.run, Tuner.launch)
    JITFunction.run, Autotuner.run, Tuner.launch = jit_run, tuner_run, every_config
    try:
        for fam, gen in aot_cases.CASES.items():
            if families and fam not in families:
                continue
            for label, call in gen(scope):
                current[0] = label
                call()
    finally:
        JITFunction.run, Autotuner.run, Tuner.launch = saved
    return list(seen.values()), kernels


@dataclass
class Result:
    kernel: str
    variant: str
    arch: int
    ok: bool
    error: str = ""
    registers: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    smem: int = -1
    mma: str = ""
    seconds: float = 0.0
    case: str = ""
    problems: list[str] = field(default_factory=list)


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_usage(log: str):
    r = _PTXAS_REGS.search(log)
    s = _PTXAS_SPILL.search(log)
    if not r or not s:
        return None
    return int(r.group(1)), int(s.group(1)), int(s.group(2))


def _run_ptxas(ptx: str, arch: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        tool = get_ptxas(arch)
    except TypeError:  # older triton: get_ptxas() takes no argument
        tool = get_ptxas()
    ptxas = getattr(tool, "path", None) or tool[0]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        p = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", f.name, "-o", os.devnull],
                           capture_output=True, text=True)
        return p.stdout + p.stderr
    finally:
        os.unlink(f.name)


def _jit_of(fn) -> JITFunction:
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    return fn


def _jit(kernels: dict, name: str) -> JITFunction:
    return _jit_of(kernels[name])


_KERNELS: dict | None = None
_ARCH: list[int] = []  # the target this worker's JIT caches were made for


def compile_one(v: Variant, arch: int) -> Result:
    """In a worker: compile `v` for sm_`arch`, measure it."""
    global _KERNELS
    if _KERNELS is None:
        from kernels.triton import aot_cases

        _KERNELS = aot_cases.kernels()
    if _ARCH != [arch]:  # a JITFunction keeps its target per device: forget it on a new target
        triton.runtime.driver.set_active(CompileOnlyDriver(arch))
        for k in _KERNELS.values():
            _jit_of(k).device_caches.clear()
        _ARCH[:] = [arch]
    res = Result(v.kernel, v.label(), arch, False, case=v.case)
    t0 = time.perf_counter()
    knobs = getattr(triton, "knobs", None)
    out = io.StringIO()
    try:
        if knobs is not None and hasattr(knobs.nvidia, "dump_ptxas_log"):
            knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(out):
            k = _jit(_KERNELS, v.kernel).warmup(*v.args, grid=(1,), **v.kwargs)
    except Exception as e:  # the compiler's message is the result
        res.error = f"{type(e).__name__}: {str(e)[-1500:]}"
        res.seconds = time.perf_counter() - t0
        return res
    target = getattr(k.metadata, "target", None)
    if target is not None and getattr(target, "arch", arch) != arch:
        res.error = f"compiled for {target}, not sm_{arch}"
        return res
    ptx = k.asm["ptx"]
    try:
        usage = _ptxas_usage(out.getvalue()) or _ptxas_usage(_run_ptxas(ptx, arch))
    except Exception as e:  # a triton without the helpers this reads: figures missing, not a crash
        usage, res.error = None, f"ptxas -v not run: {e!r}"
    if usage is None:
        res.error = res.error or "no register/spill figures from ptxas -v"
    else:
        res.registers, res.spill_stores, res.spill_loads = usage
        res.ok = True
    md = k.metadata
    res.smem = int(md.shared if hasattr(md, "shared") else md["shared"])
    res.mma = "wgmma" if "wgmma.mma_async" in ptx else ("mma" if "mma.sync" in ptx else "-")
    res.seconds = time.perf_counter() - t0
    return res


def check(res: Result, spill_budget: int, max_regs: dict | None = None) -> None:
    if not res.ok:
        res.problems.append("compile error" if not res.error.startswith(("no register", "ptxas -v")) else res.error)
        return
    if res.spill_stores > spill_budget:
        res.problems.append(f"spills {res.spill_stores} B > budget {spill_budget} B")
    limit = (MAX_REGS if max_regs is None else max_regs).get(res.kernel.split(".")[-1])
    if limit is not None and re.search(r"\b[KV]_TYPE=[1-9]", res.variant):
        limit = MAX_REGS_QUANT_KV.get(res.kernel.split(".")[-1], limit)
    if limit is not None and res.registers > limit:
        res.problems.append(f"{res.registers} registers > {limit}")
    if res.smem > SMEM_LIMIT[res.arch]:
        res.problems.append(f"shared memory {res.smem} B > sm_{res.arch} limit {SMEM_LIMIT[res.arch]} B")


def table(results: list[Result]) -> str:
    """Markdown: per target and kernel, the variant count and the resource ranges."""
    rows = ["| target | kernel | variants | registers | spill stores (B) | shared memory (KiB) | MMA | failures |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.arch, r.kernel), []).append(r)
    for (arch, kernel), rs in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        ok = [r for r in rs if r.ok]
        bad = sum(1 for r in rs if r.problems)
        regs = f"{min(r.registers for r in ok)}-{max(r.registers for r in ok)}" if ok else "-"
        spill = max((r.spill_stores for r in ok), default=0)
        smem = f"{min(r.smem for r in ok) / 1024:.1f}-{max(r.smem for r in ok) / 1024:.1f}" if ok else "-"
        mma = "/".join(sorted({r.mma for r in ok})) or "-"
        name = kernel.split(".")[-1]
        rows.append(f"| sm_{arch} | `{name}` | {len(rs)} | {regs} | {spill} | {smem} | {mma} | {bad} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the resource-bounding subset, sm_90 only (CI)")
    ap.add_argument("--arch", default=None, help="comma-separated compute capabilities (default 90,80; quick: 90)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--spill-budget", type=int, default=SPILL_BUDGET, help="spill-store bytes allowed per variant")
    ap.add_argument("--only", default=None, help="comma-separated case families (see aot_cases.CASES)")
    ap.add_argument("--exact", action="store_true",
                    help="one variant per integer-divisibility / pointer-alignment specialization too")
    ap.add_argument("--shape", action="append", default=[], help="only these model shapes (aot_cases.SHAPES names)")
    ap.add_argument("--act", action="append", default=[], help="only these activation dtypes (float32, bfloat16, ...)")
    ap.add_argument("--list", action="store_true", help="print the variants, compile nothing")
    ap.add_argument("--json", default=None, help="write the per-variant results here")
    args = ap.parse_args(argv)
    archs = [int(a) for a in (args.arch or ("90" if args.quick else "90,80")).split(",")]
    t0 = time.perf_counter()
    variants, kernels = collect(args.quick, args.only.split(",") if args.only else None, args.exact,
                                args.shape, args.act)
    reached = {v.kernel for v in variants}
    unreached = [] if args.only or args.shape or args.act else sorted(set(kernels) - reached)
    print(f"{len(variants)} variants of {len(reached)} kernels from the dispatch cases "
          f"({time.perf_counter() - t0:.1f} s); targets: {', '.join(f'sm_{a}' for a in archs)}", flush=True)
    if args.list:
        for v in variants:
            print(f"{v.kernel:40s} {v.label()}  <- {v.case}")
        if args.json:
            Path(args.json).write_text(json.dumps(
                [{"kernel": v.kernel, "case": v.case,
                  "kwargs": {k: x for k, x in v.kwargs.items() if isinstance(x, (int, float, str, bool))}}
                 for v in variants], indent=1))
        for k in unreached:
            print(f"FAIL {k}: no case in kernels/triton/aot_cases.py launches it")
        return 1 if unreached else 0
    jobs = [(v, a) for a in archs for v in variants]
    results: list[Result] = []
    ctx = __import__("multiprocessing").get_context("fork")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=ctx) as pool:
        futs = [pool.submit(compile_one, v, a) for v, a in jobs]
        for i, f in enumerate(as_completed(futs), 1):
            r = f.result()
            check(r, args.spill_budget)
            results.append(r)
            if r.problems:
                print(f"FAIL sm_{r.arch} {r.kernel} {r.variant}: {'; '.join(r.problems)} {r.error[:400]}", flush=True)
            if i % 50 == 0:
                print(f"  {i}/{len(jobs)} compiled ({time.perf_counter() - t0:.0f} s)", flush=True)
    print()
    print(table(results))
    failed = [r for r in results if r.problems]
    for k in unreached:
        print(f"FAIL {k}: no case in kernels/triton/aot_cases.py launches it")
    print(f"\n{len(results)} compilations, {len(failed)} failed, {len(unreached)} kernels unreached, "
          f"spill budget {args.spill_budget} B, {time.perf_counter() - t0:.0f} s with {args.jobs} jobs "
          f"(triton {triton.__version__})")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if failed or unreached else 0


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # real compilation, never the interpreter
    sys.exit(main())

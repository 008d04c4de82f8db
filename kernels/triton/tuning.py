"""Launch-config choice for the Triton matmul kernels, with no tuning while serving.

Each tuned kernel has a `Tuner` (its configs, a pruning rule) and picks a config per key (the
launch's M bucket, N, K, GGUF type and activation dtype):
1. one candidate left after pruning: that one;
2. a config chosen earlier, in memory or in the on-disk table: that one;
3. inside `tuning()` (the engine's start-up warm-up, `kernels.tune`): every candidate runs once
   and its output is compared with the first candidate's (`agree`: finite, relative difference
   under `Tuner.tol`); a candidate that disagrees is rejected (`stats()["rejected"]`, a warning)
   and never timed; the others are timed (CUDA events, a few launches each; elsewhere, e.g. the
   interpreter in tests, the host clock) and the fastest is kept and saved;
4. otherwise (a shape no warm-up saw, while serving; any launch off CUDA outside `tuning()`):
   the first candidate, untimed; the miss is counted (`stats()`), never tuned on a user's time.
A launch function `run(config)` returns the output it wrote.

The table lives in `$TRITIUM_CACHE/triton-tune/` (`kernels.env.cache_dir`), one JSON file per GPU
name, triton version and config list, so the next start skips the tuning. The tables are the
kernels package's only mutable state besides the compiled kernels: a cache of what a
measurement gave, never an input that changes results.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import triton

from ..env import cache_dir

_LOCK = threading.Lock()
_STATE = {"tuning": 0}  # depth of `tuning()` contexts (the warm-up runs on the engine thread)


class Tuner:
    def __init__(self, name: str, configs: list, prune: Callable[[list, dict], list] | None = None,
                 tol: float = 2e-2):
        self.name = name
        self.configs = list(configs)
        self.prune = prune
        self.tol = tol  # largest relative difference from the first candidate's output
        self.table: dict[str, int] = {}  # key -> index into configs
        self.loaded_for: str | None = None
        self.timed = 0
        self.misses = 0
        self.rejected = 0
        digest = hashlib.sha1(repr([(c.kwargs, c.num_warps, c.num_stages) for c in self.configs]).encode())
        self.digest = digest.hexdigest()[:10]

    def candidates(self, meta: dict) -> list:
        kept = self.prune(self.configs, meta) if self.prune else self.configs
        return kept or self.configs[:1]

    def _path(self, device) -> Path:
        import torch

        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        gpu = name.replace(" ", "_").replace("/", "_")
        return cache_dir() / "triton-tune" / f"{self.name}-{gpu}-triton{triton.__version__}-{self.digest}.json"

    def _load(self, device) -> None:
        tag = str(device)
        if self.loaded_for == tag:
            return
        self.loaded_for = tag
        try:
            data = json.loads(self._path(device).read_text())
            self.table.update({k: int(v) for k, v in data.items() if 0 <= int(v) < len(self.configs)})
        except (OSError, ValueError):
            pass

    def _save(self, device) -> None:
        path = self._path(device)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.table, indent=0, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs the next start its tuning

    def launch(self, key: tuple, meta: dict, device, run: Callable[[object], object]) -> object:
        """Launch `run(config)` with the config chosen for `key` (see the module docstring);
        returns the config."""
        cands = self.candidates(meta)
        if len(cands) == 1 or (device.type != "cuda" and not _STATE["tuning"]):
            run(cands[0])
            return cands[0]
        skey = "|".join(map(str, key))
        with _LOCK:
            self._load(device)
            idx = self.table.get(skey)
        if idx is not None:
            cfg = self.configs[idx]
        elif _STATE["tuning"]:
            ok = self.agreeing(cands, run, key)
            cfg = _fastest(ok, run, device)
            with _LOCK:
                self.table[skey] = self.configs.index(cfg)
                self.timed += 1
                self._save(device)
        else:
            cfg = cands[0]
            self.misses += 1
        run(cfg)
        return cfg


    def agreeing(self, cands: list, run: Callable[[object], object], key: tuple = ()) -> list:
        """The candidates whose output agrees with the first's (each run once; a candidate that
        raises, writes a non-finite value or differs by more than `tol` is rejected)."""
        ref = run(cands[0]).detach().float().clone()
        ok = [cands[0]]
        for c in cands[1:]:
            try:
                out = run(c).detach().float()
                err = agree(out, ref)
            except Exception as e:  # a candidate that does not even run is rejected too
                err = f"{type(e).__name__}: {e}"
            if err is None or (isinstance(err, float) and err <= self.tol):
                ok.append(c)
            else:
                with _LOCK:
                    self.rejected += 1
                warnings.warn(f"{self.name}: config {c.kwargs} num_warps={c.num_warps} rejected for {key}: "
                              f"its output differs from the first candidate's ({err})", RuntimeWarning, stacklevel=2)
        return ok


def agree(out, ref) -> float | str | None:
    """None when `out` equals `ref`, else the relative difference (norm-wise), or why not finite."""
    import torch

    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if not bool(torch.isfinite(out).all()):
        return "not finite"
    d = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
    return None if d == 0.0 else d


def _fastest(cands: list, run: Callable[[object], object], device, reps: int = 5):
    import torch

    best, best_t = cands[0], float("inf")
    for c in cands:
        run(c)  # compile and warm
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                run(c)
            end.record()
            end.synchronize()
            t = start.elapsed_time(end)
        else:  # the interpreter (tests): one timed run
            t0 = time.perf_counter()
            run(c)
            t = time.perf_counter() - t0
        if t < best_t:
            best, best_t = c, t
    return best


@contextlib.contextmanager
def tuning():
    """Inside: a key with no saved config is timed on the spot (start-up warm-up only)."""
    with _LOCK:
        _STATE["tuning"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["tuning"] -= 1


TUNERS: dict[str, Tuner] = {}


def register(t: Tuner) -> Tuner:
    TUNERS[t.name] = t
    return t


def stats() -> dict[str, dict[str, int]]:
    """Per tuner: keys known, keys timed by this process, untuned launches (misses), candidates
    rejected for a wrong output."""
    return {n: {"known": len(t.table), "timed": t.timed, "misses": t.misses, "rejected": t.rejected}
            for n, t in TUNERS.items()}


def tune_qmatmul(weights, dtype, max_rows: int, head=None, head_rows: int = 16, head_dtype=None) -> int:
    """Time the configs of every (M bucket, weight shape, type) a model can launch: `weights`
    (its matmul QWeights; one of each shape is enough) at 1..`max_rows` rows in `dtype`, the
    output `head` at 1..`head_rows` rows in `head_dtype` (default float32: the head's input, as
    `Model._head` runs it). Returns how many keys were timed now (0 when all came from the disk)."""
    import torch

    from . import qmatmul

    def buckets(n):
        out, m = [], 1
        while m < 2 * n:
            out.append(min(m, n))
            m *= 2
        return sorted(set(out))

    before = sum(t.timed for t in TUNERS.values())
    with tuning(), torch.inference_mode():
        seen = set()
        jobs = [(w, max_rows, dtype) for w in weights]
        if head is not None:
            jobs.append((head, head_rows, head_dtype or torch.float32))
        for w, rows, dt in jobs:
            k = (w.rows, w.cols, int(w.qtype), rows, dt)
            if k in seen:
                continue
            seen.add(k)
            for m in buckets(rows):
                x = torch.randn(m, w.cols, device=w.data.device, dtype=dt)
                qmatmul(x, w)
    return sum(t.timed for t in TUNERS.values()) - before

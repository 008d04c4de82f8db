"""llama.cpp-style log lines: `0.00.001.364 I srv  llama_server: initializing ...`.

The first column is the time since the logger was created as minutes.seconds.milliseconds.microseconds
(common/log.cpp), then the level letter, then the component and the function name right-aligned to
12 characters (SRV_INF in tools/server/server-common.h).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

LEVELS = {"D": 4, "I": 3, "W": 2, "E": 1}


class Logger:
    """Writes llama.cpp-formatted lines to a stream; `verbosity` follows `-lv` (3 = info, 4 = debug)."""

    def __init__(self, verbosity: int = 3, stream: TextIO | None = None, t0: float | None = None,
                 log_file: str | None = None):
        """verbosity < 0 (--log-disable): nothing at all. `log_file`: every line is appended there too."""
        self.verbosity = verbosity
        self.stream = stream if stream is not None else sys.stderr
        self.file = open(log_file, "a", encoding="utf-8") if log_file else None
        self.t0 = time.monotonic() if t0 is None else t0
        self._lock = threading.Lock()

    def stamp(self) -> str:
        t_us = int((time.monotonic() - self.t0) * 1e6)
        return f"{t_us // 60_000_000}.{t_us // 1_000_000 % 60:02d}.{t_us // 1000 % 1000:03d}.{t_us % 1000:03d}"

    def log(self, level: str, component: str, func: str, msg: str, min_verbosity: int | None = None) -> None:
        # errors and warnings always print; info at -lv >= 3, debug at -lv >= 4
        need = LEVELS[level] if min_verbosity is None else min_verbosity
        if self.verbosity < 0 or need > max(self.verbosity, 2):
            return
        self.raw(level, f"{component:<4} {func[:12]:>12}: {msg}")

    def raw(self, level: str, msg: str) -> None:
        """One line already formatted after the level letter (the engine's `log` callback)."""
        if self.verbosity < 0 or LEVELS.get(level, 3) > max(self.verbosity, 2):
            return
        line = f"{self.stamp()} {level} {msg}\n"
        with self._lock:
            for out in (self.stream, self.file):
                if out is not None:
                    out.write(line)
                    out.flush()

    def srv(self, level: str, func: str, msg: str, min_verbosity: int | None = None) -> None:
        self.log(level, "srv", func, msg, min_verbosity)

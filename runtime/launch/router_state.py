"""The router's plain data (runtime/launch/router.py owns and changes it): a model's state as
llama-server b1-0c1e570's `server_model_status`, its table entry, the worker process behind it,
the router's settings and the errors b1 throws."""
from __future__ import annotations

import asyncio
import socket
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from runtime.launch.model_sources import ModelSource

__all__ = ["ModelStatus", "ModelEntry", "Worker", "RouterSettings", "RouterError", "CMD_EXIT", "CMD_STATE",
           "CHILD_ADDR", "DEFAULT_STOP_TIMEOUT", "WaitQueue", "free_port"]

CMD_EXIT = "cmd_router_to_child:exit"
CMD_STATE = "cmd_child_to_router:state:"
CHILD_ADDR = "127.0.0.1"
DEFAULT_STOP_TIMEOUT = 10


class RouterError(Exception):
    """A failure b1 throws as std::runtime_error (a 500) or, with `invalid`, std::invalid_argument (400)."""

    def __init__(self, message: str, invalid: bool = False):
        super().__init__(message)
        self.invalid = invalid


class ModelStatus(Enum):
    DOWNLOADING = "downloading"
    DOWNLOADED = "downloaded"
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = "sleeping"


@dataclass
class RouterSettings:
    port: int = 8080  # the router's own (LLAMA_SERVER_ROUTER_PORT of every worker)
    models_max: int = 4  # 0: unlimited
    autoload: bool = True
    fake_timing: bool = False  # LLAMA_SERVER_DEBUG_FAKE_TIMING: 2 s more per load and per proxied request


@dataclass(eq=False)
class Worker:
    proc: asyncio.subprocess.Process
    port: int
    reader: asyncio.Task | None = None
    kill: asyncio.TimerHandle | None = None


@dataclass
class ModelEntry:
    name: str
    source: ModelSource
    options: dict[str, str]
    aliases: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    status: ModelStatus = ModelStatus.UNLOADED
    port: int = 0
    last_used: float = 0.0
    args: list[str] = field(default_factory=list)
    loaded_info: dict = field(default_factory=dict)
    progress: dict | None = None
    exit_code: int = 0
    stop_timeout: int = DEFAULT_STOP_TIMEOUT
    hidden: bool = False
    inputs: list[str] = field(default_factory=lambda: ["text"])  # what its projector takes in (GET /models)
    worker: Worker | None = None
    req_count: int = 0

    @property
    def running(self) -> bool:
        return self.status in (ModelStatus.LOADED, ModelStatus.LOADING, ModelStatus.SLEEPING)

    @property
    def ready_or_sleeping(self) -> bool:
        return self.status in (ModelStatus.LOADED, ModelStatus.SLEEPING)

    @property
    def failed(self) -> bool:
        return self.status is ModelStatus.UNLOADED and self.exit_code != 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind((CHILD_ADDR, 0))
        return s.getsockname()[1]


@dataclass
class _Waiting:
    model: str
    n_waiters: int = 1
    loading: bool = False  # one of its requests is loading the model now


class WaitQueue:
    """Requests waiting for a place under `--models-max` (b1's server_lru_sched queue): FIFO, one
    entry per model whatever the number of its requests, so that they share one place."""

    def __init__(self, log: Callable[[str], None]):
        self.entries: deque[_Waiting] = deque()
        self.log = log

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def find(self, name: str) -> _Waiting | None:
        return next((w for w in self.entries if w.model == name), None)

    def join(self, name: str) -> None:
        w = self.find(name)
        if w is not None:
            w.n_waiters += 1
            self.log(f"request for name={name} joined the queue, {w.n_waiters} waiting")
            return
        self.entries.append(_Waiting(name))
        self.log(f"request for name={name} queued at position {len(self.entries)}")

    def leave(self, name: str) -> None:
        w = self.find(name)
        if w is not None:
            w.n_waiters -= 1
            if w.n_waiters <= 0:
                self.entries.remove(w)

    def try_claim(self, name: str, has_capacity: bool) -> bool:
        """Whether it is `name`'s turn to load (first in line, nobody loading it, a place free)."""
        head = self.entries[0] if self.entries else None
        if head is None or head.model != name or head.loading or not has_capacity:
            return False
        head.loading = True
        return True

    def claim_done(self, name: str, ok: bool) -> None:
        w = self.find(name)
        if w is not None and not ok:
            w.loading = False  # back in line

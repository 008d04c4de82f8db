"""The tensor-parallel process group: rank, world size, the command channel from rank 0 to the
other ranks, and the collectives the model's forward uses.

Started by torchrun (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment, the
standard env:// rendezvous) or by `tritium-server -tp N`, which sets the same variables for the
ranks it spawns (`runtime.parallel.worker.spawn`). gloo on the CPU, NCCL on CUDA.
"""
from __future__ import annotations

import datetime
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

TIMEOUT_S = float(os.environ.get("TRITIUM_TP_TIMEOUT", "300"))


def _fatal_on_error(fn: Callable) -> Callable:
    """A failed collective means a rank is gone and the ranks are out of step: nothing can be
    computed any more, so the process ends with an error instead of hanging or serving errors."""
    @functools.wraps(fn)
    def wrapper(self, *a, **kw):
        try:
            return fn(self, *a, **kw)
        except (RuntimeError, ConnectionError) as e:
            print(f"tensor parallel: rank {self.rank} lost its peers in {fn.__name__} ({e}); exiting",
                  file=sys.stderr, flush=True)
            os._exit(1)
    return wrapper


@dataclass
class TPGroup:
    rank: int
    world: int
    backend: str  # "gloo" | "nccl"

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ---- rank 0 -> the others ----------------------------------------------------------------
    @_fatal_on_error
    def send(self, cmd: tuple) -> None:
        """Rank 0: a command for the other ranks (picklable; tensors on the CPU)."""
        assert self.leader
        dist.broadcast_object_list([cmd], src=0)

    @_fatal_on_error
    def recv(self) -> tuple:
        """Ranks 1..N-1: the next command of rank 0."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @_fatal_on_error
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    # ---- the forward's collectives -------------------------------------------------------------
    @_fatal_on_error
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks, in place (x: a row-parallel layer's partial output [T, C])."""
        if x.dtype != torch.float32 and x.device.type == "cpu":  # gloo sums float32 exactly as the ranks
            y = x.float()
            dist.all_reduce(y)
            x.copy_(y)
        else:
            dist.all_reduce(x)
        return x

    @_fatal_on_error
    def all_gather_cols(self, x: torch.Tensor, n_total: int) -> torch.Tensor:
        """Concatenate every rank's column block x [T, n_local] (padded to the same width; the last
        rank's may be narrower in the file) into [T, n_total]."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)[:, :n_total]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_from_env(device: str) -> TPGroup | None:
    """The group described by the environment (torchrun's variables), or None for one rank."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    rank = int(os.environ["RANK"])
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    return TPGroup(rank, world, backend)

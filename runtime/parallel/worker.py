"""Ranks 1..N-1 of a tensor-parallel server, and how one machine starts them.

A worker loads its shard of the model and an identically shaped KV store holding its KV heads, then
obeys rank 0's commands until told to stop: "forward" (run the step on its shard, taking part in
the all-reduces and the logits gather), "kv_copy" / "kv_gather" / "kv_scatter" (the KV data
operations of runtime.parallel.kv), "stop". It never decides anything: block ids, slots and
positions all come from rank 0.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from runtime.parallel.kv import local_heads


def serve(model, store) -> None:
    """The command loop of a worker rank over its `KVStore` (returns on "stop")."""
    group = model.tp.group
    while True:
        cmd = group.recv()
        op = cmd[0]
        if op == "forward":
            model.run_step(store, cmd[1])
        elif op == "kv_copy":
            store.copy_block(cmd[1], cmd[2])
        elif op == "kv_gather":
            ks, vs = store.gather_slots(cmd[1])
            group.gather(([k.cpu() for k in ks], [v.cpu() for v in vs]))
        elif op == "kv_scatter":
            store.scatter_slots(cmd[1], *local_heads(model.tp, cmd[2], cmd[3]))
        elif op == "stop":
            return
        else:
            raise RuntimeError(f"tensor parallel: unknown command {op!r}")


def watch_parent() -> None:
    """Spawned by `tritium-server -tp N`: end with the rank-0 process that started this one."""
    parent = os.getppid()

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=poll, name="tritium-tp-parent", daemon=True).start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(n: int, argv: list[str], on_exit) -> list[subprocess.Popen]:
    """One machine, `tritium-server -tp N`: make this process rank 0 of N and start ranks 1..N-1
    as `python -m api.cli <the same arguments>` with torchrun's environment variables. A thread
    watches them: when one ends while rank 0 runs, `on_exit(rank, returncode)` is called."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(n),
               TRITIUM_TP_SPAWNED="1")
    procs = []
    for r in range(1, n):
        procs.append(subprocess.Popen([sys.executable, "-m", "api.cli", *argv],
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
    os.environ.update({k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")},
                      RANK="0", LOCAL_RANK="0")

    def watch() -> None:
        while True:
            for r, p in enumerate(procs, start=1):
                if p.poll() is not None:
                    on_exit(r, p.returncode)
                    return
            time.sleep(0.2)
    threading.Thread(target=watch, name="tritium-tp-watch", daemon=True).start()
    return procs

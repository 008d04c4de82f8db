"""A router worker's process (b1-0c1e570's server_models child protocol, tools/server/server-models.cpp).

The worker, started with `LLAMA_SERVER_ROUTER_PORT` set (runtime/launch/router_child.py), reports
`loading`/`ready` as `cmd_child_to_router:state:{json}` lines on its stdout (the router forwards every
other line to its own log, prefixed `[port]`) and leaves when `cmd_router_to_child:exit` arrives on its
stdin (force-killed after the model's `stop-timeout`, default 10 s) or when its stdin closes. The
policy (which model loads, unloads, waits) stays with runtime/launch/router.py's ModelRouter."""
from __future__ import annotations

import asyncio
import json
import os
from typing import Callable

from runtime.launch.router_state import CMD_EXIT, CMD_STATE, Worker

MAX_LINE = 1 << 20  # a worker line longer than this is dropped (b1 server_monitor::max_line)


async def spawn(args: list[str], port: int, router_port: int) -> Worker:
    """Starts `python -m api.cli ...` (`args`) reporting to the router on `router_port` (OSError if it cannot)."""
    env = dict(os.environ, LLAMA_SERVER_ROUTER_PORT=str(router_port))
    env.pop("TRITIUM_DEFAULT_MODEL", None)
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
    return Worker(proc, port)


async def read_lines(w: Worker, on_line: Callable[[str], None]) -> int:
    """Calls `on_line` for each line the worker writes until its output closes; its exit code."""
    buf = b""
    assert w.proc.stdout is not None
    while True:
        chunk = await w.proc.stdout.read(4096)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            on_line(line.decode("utf-8", "replace"))
        if len(buf) > MAX_LINE:
            buf = b""
    if buf:
        on_line(buf.decode("utf-8", "replace"))
    code = await w.proc.wait()
    if w.kill is not None:
        w.kill.cancel()
    return code


def state_line(line: str) -> tuple[str, dict] | None:
    """(state, payload) of a `cmd_child_to_router:state:{json}` line; None for any other line;
    ValueError when its JSON cannot be read."""
    if not line.startswith(CMD_STATE):
        return None
    try:
        data = json.loads(line[len(CMD_STATE):])
        return data.get("state", ""), data.get("payload") or {}
    except (ValueError, AttributeError) as ex:
        raise ValueError(str(ex)) from None


def send_exit(w: Worker) -> None:
    try:
        assert w.proc.stdin is not None
        w.proc.stdin.write((CMD_EXIT + "\n").encode())
    except (OSError, RuntimeError, AssertionError):
        pass

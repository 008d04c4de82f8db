"""A router's worker (runtime/launch/router.py): a `tritium-server` started with
`LLAMA_SERVER_ROUTER_PORT` set. As b1-0c1e570's `server_child`: it tells the router its state on
stdout (`\\ncmd_child_to_router:state:{"state": ..., "payload": ...}\\n`; the leading newline ends
whatever log line is open on the shared pipe) and watches its stdin: `cmd_router_to_child:exit`
shuts it down as SIGTERM does (drain, exit 0); end of file (the router died) ends it at once.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading

__all__ = ["is_child", "notify", "loading", "watch_stdin"]

CMD_EXIT = "cmd_router_to_child:exit"
CMD_STATE = "cmd_child_to_router:state:"
_lock = threading.Lock()


def is_child() -> bool:
    return os.environ.get("LLAMA_SERVER_ROUTER_PORT") is not None


def notify(state: str, payload: dict) -> None:
    line = "\n" + CMD_STATE + json.dumps({"state": state, "payload": payload}, ensure_ascii=False,
                                         separators=(",", ":")) + "\n"
    with _lock:
        sys.stderr.flush()
        sys.stdout.write(line)
        sys.stdout.flush()


def loading(value: float) -> None:
    """The model's load progress (b1's load_progress_callback; 0 at the start, 1 once read)."""
    if is_child():
        notify("loading", {"stages": ["text_model"], "current": "text_model", "value": value})


def watch_stdin(log) -> None:
    """Starts the thread that waits for the router's exit command (or for its death)."""
    def run() -> None:
        log("child server monitoring thread started, waiting for EOF on stdin...")
        for line in sys.stdin:
            if CMD_EXIT in line:
                log("exit command received, exiting...")
                os.kill(os.getpid(), signal.SIGTERM)
                return
        log("EOF on stdin detected, forcing shutdown...")
        os._exit(1)

    threading.Thread(target=run, name="tritium-router-child", daemon=True).start()

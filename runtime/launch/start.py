"""Process start-up, as `api/cli.py` calls it once the flags are parsed: the model read while the
rest of the server imports, the process's CPUs and priority, the `-hf` download, the `-tp` ranks,
and the engine's load and start. Nothing here parses a flag or serves HTTP.

Order (`api.cli.main`): `preload` (before torch and the web stack are imported) -> `pin_process`
-> `fetch_hf` -> on ranks 1..N-1 `serve_rank` (no HTTP) / on rank 0 `start_ranks` -> the HTTP
server starts -> `start_engine` on a thread (the server answers 503 "Loading model" meanwhile).

`Say` is the caller's logger: `say(level, message)` with llama-server's levels ("I", "W", "E").
This module imports neither torch nor the serving room at import: each function imports what it
starts.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from runtime.launch.preload import Preload
    from runtime.serving import Engine, EngineConfig

Say = Callable[[str, str], None]

# --prio -> nice value (llama.cpp's ggml_sched_priority: -1 low, 0 normal, 1 medium, 2 high, 3 realtime)
NICE = {-1: 10, 1: -5, 2: -10, 3: -20}


def preload(path: str, device: str, n_ranks: int, from_hub: bool) -> Preload | None:
    """Start reading `path`'s GGUF file and repacking its matrices for the CPU kernels on a thread
    (runtime/launch/preload.py) where the model will run in this process on the CPU: one rank, not
    from the Hub, --device cpu, or auto on a machine without an NVIDIA driver. None otherwise."""
    if not path or from_hub or n_ranks > 1 or device not in ("cpu", "auto"):
        return None
    if not os.path.isfile(path) or path.endswith(".safetensors"):
        return None
    from runtime.launch.preload import Preload, nvidia_present

    if device == "auto" and nvidia_present():
        return None
    return Preload(path)


def pin_process(cpus: set[int] | None, prio: int, say: Say) -> None:
    """-C/-Cr: pin the process (threads started later, torch's and the kernels' OpenMP pools
    included, inherit it); --prio: its nice value. A refusal is a warning."""
    if cpus is not None:
        try:
            os.sched_setaffinity(0, cpus)
            say("I", f"pinned to CPUs {','.join(map(str, sorted(cpus)))}")
        except (OSError, AttributeError, ValueError) as e:
            say("W", f"could not set the CPU affinity: {e}")
    if prio:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, NICE.get(prio, 0))
        except (OSError, AttributeError) as e:
            say("W", f"could not set the process priority {prio}: {e}")


def fetch_hf(repo: str, file: str | None, token: str | None, offline: bool, say: Say,
             mmproj: bool = False) -> tuple[str, str | None] | None:
    """-hf: the model file from the Hub (or its cache) and, with `mmproj`, the repository's projector
    for it (None when it has none); None (reported) when the model cannot be had."""
    from runtime.launch.hf_download import HfDownloadError, HfModelRequest, download_files

    req = HfModelRequest(repo, file=file, token=token or os.environ.get("HF_TOKEN"), offline=offline)
    try:
        path, proj = download_files(req, log=lambda m: say("W", m), mmproj=mmproj)
    except HfDownloadError as e:
        say("E", f"failed to fetch model metadata: {e}")
        return None
    say("I", f"model from {repo}: {path}" + (f" (multimodal projector {proj})" if proj else ""))
    return str(path), None if proj is None else str(proj)


def fetch_url(url: str, offline: bool, say: Say) -> str | None:
    """-mmu URL: the file downloaded once into $TRITIUM_CACHE/downloads (named by the URL's last path
    component and its hash), reused afterwards; with --offline only the cached copy; None (reported)
    when it cannot be had."""
    import hashlib
    import tempfile
    import urllib.request

    from runtime.model.model_files import cache_root

    name = os.path.basename(url.split("?", 1)[0].rstrip("/")) or "download"
    target = cache_root() / "downloads" / f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{name}"
    if target.exists():
        return str(target)
    if offline:
        say("E", f"required file is not available in cache (offline mode): {target}")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    say("I", f"downloading {url} to {target}")
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=60) as r:
            while chunk := r.read(1 << 20):
                f.write(chunk)
        os.replace(tmp, target)
    except (OSError, ValueError) as e:
        say("E", f"failed to download {url}: {e}")
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        return None
    return str(target)


def start_ranks(n: int, argv: list[str], say: Say) -> None:
    """`-tp N` without torchrun: this process becomes rank 0 and starts ranks 1..N-1 with the same
    arguments; when one of them ends, the server ends with an error (a tensor-parallel model cannot
    run without a rank)."""
    from runtime.parallel.worker import spawn

    procs: list = []

    def on_exit(rank: int, code: int) -> None:
        say("E", f"tensor parallel rank {rank} exited with status {code}: shutting down")
        for p in procs:
            if p.poll() is None:
                p.kill()
        os._exit(1)
    procs.extend(spawn(n, argv, on_exit))


def serve_rank(ecfg: EngineConfig, log: Callable[[str, str], None]) -> None:
    """Ranks 1..N-1: no HTTP server, only the model's shard (runtime/parallel/worker.py); a rank
    that rank 0 started ends with it."""
    from runtime.serving.bootstrap import serve_worker

    if os.environ.get("TRITIUM_TP_SPAWNED"):
        from runtime.parallel.worker import watch_parent
        watch_parent()
    serve_worker(ecfg, log)


def start_engine(ecfg: EngineConfig, on_built: Callable[[Engine], None],
                 on_loaded: Callable[[Engine], None]) -> Engine:
    """Build the engine, `on_built(engine)` (the caller attaches it: its HTTP server answers
    "Loading model" from it), load the model (without -m: the default model,
    runtime.model.tiny_model), `on_loaded(engine)` (the caller reports it), start its thread."""
    from runtime.serving import Engine

    engine = Engine(ecfg)
    on_built(engine)
    engine.load()
    on_loaded(engine)
    engine.start()
    return engine

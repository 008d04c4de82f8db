"""Fixtures that run the real server (`python -m api.cli`) as a subprocess on a free loopback port.

`lesson_model`: the lesson's tiny model (llama, 4 layers, 256 dims, Qwen2 vocabulary, f32; 322 MB),
generated once per session from `../shared/vocab/ggml-vocab-qwen2.gguf` (skipped without shared/).
`start_server(*args)`: starts a server, waits for /health 200, stops it at the end of the session
unless the test stops it first. Servers are meant to be module-scoped: each start costs seconds.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `python -m api.cli` child process; stderr goes to a file so the log can be read."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self._extra, self._env = list(args), env
        self._spawn()

    def _spawn(self) -> None:
        # free_port() releases the port before the child binds it: another test run's server may take
        # it first. Then this child exits ("couldn't bind") and wait_ready starts it again on a new port;
        # /health is trusted only once this child has logged "listening on" (it binds before loading),
        # so another process's server on the port is never taken for this one.
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--host", "127.0.0.1", "--port", str(self.port), *self._extra]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "api.cli", *self.args], cwd=REPO,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=self._env)
        self.health_statuses: list[int] = []

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        retries = 3
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if retries and "couldn't bind HTTP server socket" in self.log():
                    retries -= 1
                    self._log.close()
                    self._spawn()
                    continue
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2.0)
                self.health_statuses.append(r.status_code)
                # (a run that sets the log verbosity may not print "listening on": /health alone then)
                quiet = any(a in ("-lv", "--verbosity", "--log-verbosity", "--log-disable") for a in self._extra)
                if r.status_code == 200 and (quiet or "listening on" in self.log()):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _prebuild_kernels(cache: Path) -> None:
    """The C libraries every server loads, compiled here once (into this process's cache, which the
    in-process tests share) and copied into the servers' cache: a server's first start then does
    not compile for minutes inside its readiness timeout. A copy is the same build: the file name is
    a hash of the sources, flags and compiler target."""
    from kernels import env as kenv
    from kernels.cpu import native, qdot_lib

    for lib in (native.KERNELS, lambda: qdot_lib.library(qdot_lib.current_isa())):
        try:
            built = native.build(lib() if callable(lib) else lib)
        except (native.BuildError, ValueError):
            continue  # the server logs it and takes the torch paths (or refuses a forced ISA itself)
        if built is not None and kenv.cache_dir().resolve() != cache.resolve():
            cache.mkdir(parents=True, exist_ok=True)
            if not (cache / built.name).exists():
                tmp = cache / (built.name + ".part")
                shutil.copyfile(built, tmp)
                os.replace(tmp, cache / built.name)


@pytest.fixture(scope="session")
def server_env(tmp_path_factory) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TRITIUM_CACHE", str(tmp_path_factory.getbasetemp() / "tritium-cache"))
    env.pop("TRITON_INTERPRET", None)  # the server runs torch reference ops on CPU
    env.setdefault("TRITIUM_DEFAULT_MODEL", "builtin")  # no -m: the random-weight model even with SmolLM2 installed
    _prebuild_kernels(Path(env["TRITIUM_CACHE"]))
    return env


@pytest.fixture(scope="session")
def start_server(tmp_path_factory, server_env):
    procs: list[ServerProcess] = []
    logs = tmp_path_factory.mktemp("server-logs")

    def start(*args: str, wait: bool = True) -> ServerProcess:
        p = ServerProcess(list(args), logs / f"server-{len(procs)}.log", server_env)
        procs.append(p)
        return p.wait_ready() if wait else p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "vocab" / "ggml-vocab-qwen2.gguf").exists():
        pytest.skip("../shared (vocab files) is not available")
    return SHARED


@pytest.fixture(scope="session")
def lesson_model(shared_dir, tmp_path_factory) -> Path:
    from runtime.model.tiny_model import TinyModelSpec, write_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-random-qwen2vocab-f32.gguf"
    write_tiny_model(path, TinyModelSpec(), vocab=shared_dir / "vocab" / "ggml-vocab-qwen2.gguf")
    return path


# ---- in-process API tests (tests/test_api_*.py) -------------------------------------------

API_N_CTX_SLOT = 256


@pytest.fixture(scope="session")
def api_engine(tmp_path_factory):
    """A started engine on a tiny generated model (1 layer, 64 dims, built-in ChatML vocabulary):
    2 slots of 256 tokens, slot files in a temporary folder."""
    from runtime.serving import Engine, EngineConfig
    from runtime.model.tiny_model import spec_with, write_tiny_model

    d = tmp_path_factory.mktemp("api-inprocess")
    path = d / "api-tiny.gguf"
    write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=512,
                                     name="api-tiny", seed=7), vocab="builtin")
    (d / "slots").mkdir()
    e = Engine(EngineConfig(model_path=str(path), n_ctx=2 * API_N_CTX_SLOT, n_parallel=2, verbosity=0,
                            warmup=False, slot_save_path=str(d / "slots")))
    e.load()
    e.start()
    yield e
    e.stop()


@pytest.fixture(scope="session")
def api_client():
    """`api_client(engine, **server_config)`: a FastAPI TestClient on a fresh, ready app
    (`api.server.create_app`) around `engine`, without a server process."""
    from fastapi.testclient import TestClient

    from api.server import ServerConfig, create_app

    def make(engine, **cfg) -> TestClient:
        app = create_app(ServerConfig(model_path="api-tiny.gguf", **cfg), engine)
        app.state.server.set_ready()
        return TestClient(app, raise_server_exceptions=False)

    return make

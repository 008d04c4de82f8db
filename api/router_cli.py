"""`tritium-server` as a router (llama-server b1-0c1e570's router mode): several models, each in
its own worker process (runtime/launch/router.py), one HTTP front (api/router_app.py).

When: no `-m`/`-hf`, and `--models-dir` or `--models-preset` given, or (unless
`TRITIUM_DEFAULT_MODEL` asks for the default or built-in model) llama.cpp's Hugging Face cache holds
models to route to. b1 routes whenever there is no model; tritium keeps serving its default model
(else its built-in one) for a bare `tritium-server` when there is nothing to route to.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket

from api.cli_args import OPTIONS
from api.context import ServerConfig
from api.log import Logger
from api.router_args import MODEL_KEYS, RESERVED, OptionTable

__all__ = ["is_router_mode", "run_router"]


def is_router_mode(args: argparse.Namespace) -> bool:
    from runtime.launch.model_sources import cached_models

    if args.model or args.hf_repo:
        return False
    if args.models_dir or args.models_preset:
        return True
    return not os.environ.get("TRITIUM_DEFAULT_MODEL") and bool(cached_models())


def _bind(hosts: list[str], port: int, log: Logger) -> list[socket.socket] | None:
    socks: list[socket.socket] = []
    for host in hosts:
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if ":" in host and len(hosts) > 1:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((host, port))
            sock.listen(512)
        except OSError as e:
            log.srv("E", "llama_server", f"couldn't bind HTTP server socket, hostname: {host}, port: {port}: {e}")
            for s in socks:
                s.close()
            return None
        port = sock.getsockname()[1]
        socks.append(sock)
    return socks


def run_router(args: argparse.Namespace, argv: list[str], cfg: ServerConfig) -> int:
    """Serves until SIGTERM; `cfg`: the checked settings of the command line (api/cli.py)."""
    import uvicorn

    from api.cli import verbosity
    from api.router_app import create_router_app
    from api.shutdown import DrainingServer, header_timeout_protocol
    from runtime.launch.model_sources import PresetError, collect_presets
    from runtime.launch.router import ModelRouter, RouterError, RouterSettings

    log = Logger(verbosity(args), log_file=args.log_file)
    log.srv("I", "llama_server", "initializing ...")
    table = OptionTable(OPTIONS)
    base = {k: v for k, v in table.options_of_argv(argv).items() if k not in RESERVED and k not in MODEL_KEYS}
    settings = RouterSettings(port=cfg.port, models_max=4 if args.models_max is None else args.models_max,
                              autoload=args.models_autoload is not False,
                              fake_timing=bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING")))

    def presets():
        return collect_presets(args.models_dir, args.models_preset, base, table.canon)

    def say(level: str, msg: str) -> None:
        log.srv(level, "load_models", msg)

    def forward(line: str) -> None:
        with log._lock:
            log.stream.write(line + "\n")
            log.stream.flush()
    ui = {}
    if getattr(args, "ui_config", None):
        try:
            ui = json.loads(args.ui_config)
        except ValueError as e:
            log.srv("E", "llama_server", f"failed to parse UI config: {e}")
            return 1
    socks = _bind(cfg.hosts, cfg.port, log)
    if socks is None:
        return 1
    port = socks[0].getsockname()[1]
    settings.port = port

    async def serve() -> int:
        models = ModelRouter(settings, presets, table.render, say, forward)
        try:
            models.load_models()
        except (RouterError, PresetError) as e:
            log.srv("E", "llama_server", f"failed to initialize router models: {e}")
            return 1
        app = create_router_app(cfg, models, log, ui)
        ctx = app.state.server
        ctx.hf_token, ctx.offline = args.hf_token or os.environ.get("HF_TOKEN"), args.offline

        def on_exit(msg: str) -> None:
            ctx.stopping = True
            log.srv("I", "llama_server", msg)
        uv = DrainingServer(uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                                           timeout_keep_alive=args.timeout, lifespan="off",
                                           http=header_timeout_protocol(args.header_timeout)),
                            app.state.drain, args.shutdown_timeout, on_exit)
        log.srv("W", "llama_server", "security: router mode enabled - do not expose to untrusted environments")
        log.srv("I", "llama_server", "starting server in router mode. models will be automatically loaded on-demand")
        server = asyncio.ensure_future(uv.serve(sockets=socks))
        while not uv.started and not server.done():
            await asyncio.sleep(0.01)
        rc = 0
        try:
            await models.load_startup()
        except RouterError as e:
            log.srv("E", "llama_server", f"failed to load models on startup: {e}")
            uv.should_exit, rc = True, 1
        for host in cfg.hosts:
            log.srv("I", "llama_server", f"listening on http://{f'[{host}]' if ':' in host else host}:{port}")
        if port == 8080:
            log.srv("W", "llama_server", "notice: server default port will be changed to :9931 in a future "
                                         "release (ref: https://github.com/ggml-org/llama.cpp/pull/26508)")
        try:
            await server
        finally:
            log.srv("I", "clean_up", "clean_up: cleaning up before exit...")
            ctx.stopping = True
            await models.unload_all()
        return rc
    return asyncio.run(serve())

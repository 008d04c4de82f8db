"""`tritium-server`: llama-server's command line.

The HTTP socket is bound first and the model loads in a background thread, so `/health` answers
503 `Loading model` until the engine is ready (llama-server does the same).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading

from api.app import ServerConfig, create_app
from api.log import Logger
from api.params import f32
from runtime.tasks import SamplingParams

POOLING = ("none", "mean", "cls", "last", "rank")


class ArgError(Exception):
    def __init__(self, flag: str, message: str):
        super().__init__(f'error while handling argument "{flag}": {message}')


def build_parser() -> argparse.ArgumentParser:
    d = SamplingParams()
    p = argparse.ArgumentParser(
        prog="tritium-server",
        description="A llama-server compatible LLM inference server (OpenAI-compatible and native endpoints).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model and context")
    g.add_argument("-m", "--model", default=None, metavar="FNAME",
                   help="model path (GGUF file or Hugging Face folder); without it a built-in tiny model is used")
    g.add_argument("-a", "--alias", default=None, help="model name in API responses (default: the model path)")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N",
                   help="size of the prompt context, 0 = loaded from the model")
    g.add_argument("-np", "--parallel", type=int, default=-1, metavar="N",
                   help="number of server slots (-1 = auto: 4 slots sharing a unified KV cache)")
    g.add_argument("-kvu", "--kv-unified", action="store_true", default=False,
                   help="use a single unified KV buffer shared by all slots")
    g.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="number of tokens to predict (-1 = until end of generation or context)")
    g.add_argument("-t", "--threads", type=int, default=-1, metavar="N", help="CPU threads (-1 = torch default)")
    g.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the model runs (auto = cuda when available)")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", default=None, metavar="N",
                   help="accepted for compatibility; the whole model runs on --device")

    g = p.add_argument_group("sampling defaults")
    g.add_argument("--temp", type=float, default=d.temperature, metavar="N", help="temperature")
    g.add_argument("--top-k", type=int, default=d.top_k, metavar="N", help="top-k sampling (0 = disabled)")
    g.add_argument("--top-p", type=float, default=d.top_p, metavar="N", help="top-p sampling (1.0 = disabled)")
    g.add_argument("--min-p", type=float, default=d.min_p, metavar="N", help="min-p sampling (0.0 = disabled)")
    g.add_argument("--typical", type=float, default=d.typical_p, metavar="N", help="locally typical sampling p")
    g.add_argument("-s", "--seed", type=int, default=-1, metavar="SEED", help="RNG seed (-1 = random)")
    g.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty, metavar="N",
                   help="penalize repeated tokens (1.0 = disabled)")
    g.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n, metavar="N",
                   help="last n tokens to penalize (0 = disabled, -1 = ctx size)")
    g.add_argument("--presence-penalty", type=float, default=d.presence_penalty, metavar="N")
    g.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty, metavar="N")
    g.add_argument("--samplers", default=None, metavar="SAMPLERS",
                   help="samplers in order, separated by ';' (default: " + ";".join(d.samplers) + ")")

    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="IP address to listen on")
    g.add_argument("--port", type=int, default=8080, help="port to listen on")
    g.add_argument("--api-key", default=None, metavar="KEY", help="API key(s), comma-separated")
    g.add_argument("--api-key-file", default=None, metavar="FNAME", help="file with one API key per line")
    g.add_argument("--cors-origins", default="*", metavar="ORIGINS",
                   help="comma-separated origins allowed by CORS ('*' = all)")
    g.add_argument("--timeout", "-to", type=int, default=600, metavar="N", help="HTTP keep-alive timeout in seconds")
    g.add_argument("--metrics", action="store_true", help="enable the Prometheus /metrics endpoint")
    g.add_argument("--slots", dest="slots", action="store_true", default=True, help="enable the /slots endpoint")
    g.add_argument("--no-slots", dest="slots", action="store_false", help="disable the /slots endpoint")
    g.add_argument("--props", action="store_true", help="allow changing global properties with POST /props")
    g.add_argument("--slot-save-path", default=None, metavar="PATH", help="directory for slot KV cache files")
    g.add_argument("--sse-ping-interval", type=float, default=30.0, metavar="N",
                   help="seconds between SSE keep-alive comments while a stream is idle (0 = off)")
    g.add_argument("-lv", "--verbosity", "--log-verbosity", type=int, default=3, metavar="N",
                   help="log verbosity (3 = info, 4 = debug)")
    g.add_argument("-v", "--verbose", action="store_true", help="log everything (verbosity 4)")

    g = p.add_argument_group("prompt caching")
    g.add_argument("--cache-ram", "-cram", type=int, default=8192, metavar="N",
                   help="RAM prompt cache size limit in MiB (-1 = no limit, 0 = disabled)")
    g.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="min chunk size to reuse from the cache via KV shifting (0 = disabled)")
    g.add_argument("--slot-prompt-similarity", "-sps", type=float, default=0.10, metavar="N",
                   help="how much a prompt must match a slot's cache to use that slot (0.0 = disabled)")

    g = p.add_argument_group("embeddings")
    g.add_argument("--embeddings", "--embedding", action="store_true",
                   help="restrict the server to embedding endpoints")
    g.add_argument("--pooling", default="mean", choices=POOLING, help="pooling type for embeddings")
    g.add_argument("--embd-normalize", type=int, default=2, metavar="N",
                   help="embedding normalization (-1 none, 0 max absolute, 1 taxicab, 2 euclidean, >2 p-norm)")

    g = p.add_argument_group("chat templates and reasoning")
    g.add_argument("--jinja", dest="jinja", action="store_true", default=True, help="use the Jinja chat template engine")
    g.add_argument("--no-jinja", dest="jinja", action="store_false", help="disable Jinja templates (no tool calls)")
    g.add_argument("--chat-template", default=None, metavar="JINJA_TEMPLATE",
                   help="chat template name or Jinja source (default: the model's)")
    g.add_argument("--chat-template-file", default=None, metavar="FNAME", help="file holding a Jinja chat template")
    g.add_argument("--reasoning-format", "-rf", default="auto", choices=("none", "auto", "deepseek", "deepseek-legacy"),
                   help="where reasoning text goes: none keeps it in content, deepseek puts it in reasoning_content")
    g.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="thinking tokens allowed (-1 = unlimited, 0 = end thinking at once)")
    g.add_argument("--reasoning", "-rea", default=None, choices=("on", "off", "auto"),
                   help="set enable_thinking for every request")
    return p


def _api_keys(args: argparse.Namespace) -> list[str]:
    keys = [k for k in (args.api_key or "").split(",") if k]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise ArgError("--api-key-file", f"error: failed to open file '{args.api_key_file}': {e.strerror}")
    return keys


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig of parsed arguments; raises ArgError like llama-server."""
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise ArgError("--slot-save-path", f"not a directory: {args.slot_save_path}")
    if args.chat_template_file is not None and not os.path.isfile(args.chat_template_file):
        raise ArgError("--chat-template-file", f"error: failed to open file '{args.chat_template_file}'")
    d = SamplingParams()
    defaults = SamplingParams(
        temperature=f32(args.temp), top_k=args.top_k, top_p=f32(args.top_p), min_p=f32(args.min_p),
        typical_p=f32(args.typical), seed=args.seed & 0xFFFFFFFF, repeat_penalty=f32(args.repeat_penalty),
        repeat_last_n=args.repeat_last_n, presence_penalty=f32(args.presence_penalty),
        frequency_penalty=f32(args.frequency_penalty),
        dynatemp_range=f32(d.dynatemp_range), dynatemp_exponent=f32(d.dynatemp_exponent),
        xtc_probability=f32(d.xtc_probability), xtc_threshold=f32(d.xtc_threshold), dry_base=f32(d.dry_base),
        samplers=[s for s in args.samplers.split(";") if s] if args.samplers else list(d.samplers))
    return ServerConfig(
        model_path=args.model or "", alias=args.alias, host=args.host, port=args.port, api_keys=_api_keys(args),
        cors_origins=[o.strip() for o in args.cors_origins.split(",") if o.strip()] or ["*"],
        metrics=args.metrics, slots=args.slots, props=args.props, slot_save_path=args.slot_save_path,
        sse_ping_interval=args.sse_ping_interval, embeddings=args.embeddings, pooling=args.pooling,
        embd_normalize=args.embd_normalize, jinja=args.jinja, reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget, enable_thinking={"on": True, "off": False}.get(args.reasoning or ""),
        n_predict=args.n_predict, defaults=defaults)


def engine_config(args: argparse.Namespace, scfg: ServerConfig):
    """The EngineConfig of parsed arguments (imports the engine, hence torch)."""
    from runtime.engine import EngineConfig

    device = args.device  # "auto" is resolved by the engine
    return EngineConfig(
        model_path=args.model, n_ctx=args.ctx_size, n_parallel=args.parallel,
        kv_unified=True if args.kv_unified else None, n_threads=args.threads, device=device,
        cache_ram_mib=args.cache_ram, cache_reuse=args.cache_reuse,
        slot_prompt_similarity=args.slot_prompt_similarity, slot_save_path=args.slot_save_path,
        embeddings=args.embeddings, pooling=args.pooling, n_predict=args.n_predict, defaults=scfg.defaults,
        chat_template=args.chat_template, chat_template_file=args.chat_template_file,
        verbosity=verbosity(args))


def verbosity(args: argparse.Namespace) -> int:
    return 4 if args.verbose else args.verbosity


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        scfg = server_config(args)
    except ArgError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
    log = Logger(verbosity(args))
    log.srv("I", "llama_server", "initializing ...")
    log.log("I", "cmn", "common_params_print_info",
            f"common_params_print_info: verbosity = {log.verbosity} (adjust with the `-lv N` CLI arg)")
    if not scfg.api_keys:
        log.srv("W", "llama_server", "security: no API key is set and CORS allows all origins (see https://github.com/ggml-org/llama.cpp/pull/25655)"
                if "*" in scfg.cors_origins else "security: no API key is set")

    try:
        sock = socket.socket(socket.AF_INET6 if ":" in scfg.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # inherited by accepted connections: without it a keep-alive client waits ~40 ms for every
        # response after the first (Nagle against delayed ACKs)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((scfg.host, scfg.port))
        sock.listen(512)
    except OSError as e:
        log.srv("E", "llama_server", f"couldn't bind HTTP server socket, hostname: {scfg.host}, port: {scfg.port}: {e}")
        return 1
    port = sock.getsockname()[1]

    import uvicorn

    app = create_app(scfg, None, log)  # the engine is attached by the loader thread
    server = app.state.server
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=args.timeout,
                                       lifespan="off"))
    failed: list[BaseException] = []

    def load() -> None:
        try:
            from runtime.engine import Engine

            ecfg = engine_config(args, scfg)
            ecfg.log = log.raw
            server.engine = engine = Engine(ecfg)
            engine.load()  # without -m: runtime.tiny_model.ensure_default_model()
            scfg.model_path = ecfg.model_path or scfg.model_path
            log.srv("I", "load_model", f"initializing, n_slots = {engine.n_slots}, n_ctx_slot = {engine.n_ctx_slot}, "
                                       f"kv_unified = '{str(engine.kv_unified).lower()}'")
            if ecfg.cache_ram_mib != 0:
                limit = "no limit" if ecfg.cache_ram_mib < 0 else f"{ecfg.cache_ram_mib} MiB"
                log.srv("I", "load_model", f"prompt cache is enabled, size limit: {limit}", min_verbosity=4)
                log.srv("I", "load_model", "use `--cache-ram 0` to disable the prompt cache", min_verbosity=4)
            else:
                log.srv("I", "load_model", "prompt cache is disabled - use `--cache-ram N` to enable it",
                        min_verbosity=4)
            engine.start()
            server.set_ready()
            log.srv("I", "llama_server", "model loaded")
            log.srv("I", "llama_server", f"listening on http://{scfg.host}:{port}")
            if port == 8080:
                log.srv("W", "llama_server", "notice: server default port will be changed to :9931 in a future "
                                             "release (ref: https://github.com/ggml-org/llama.cpp/pull/26508)")
        except BaseException as e:  # noqa: BLE001 - reported, then the server exits
            failed.append(e)
            log.srv("E", "llama_server", f"exiting due to model loading error: {e}")
            uv.should_exit = True

    threading.Thread(target=load, name="tritium-load", daemon=True).start()
    try:
        uv.run(sockets=[sock])
    finally:
        if server.engine is not None:
            server.engine.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

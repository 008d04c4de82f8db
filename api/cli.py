"""`tritium-server`: llama-server's command line.

The HTTP socket is bound first and the model loads in a background thread, so `/health` answers
503 `Loading model` until the engine is ready (llama-server does the same).
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import socket
import sys
import threading

from typing import TYPE_CHECKING

from api import cli_net
from api.cli_args import _SPECULATIVE, _UNSUPPORTED, ArgError, _dest, build_parser
from api.log import Logger
from runtime.launch import start as launch
from runtime.tasks import SamplingParams

if TYPE_CHECKING:
    from api.server import ServerConfig
    from runtime.launch.preload import Preload

# This module imports neither torch nor the web stack: `main` starts reading the model
# (runtime/launch/preload.py) before they are imported, in the functions that need them.

def _cpu_set(args: argparse.Namespace) -> set[int] | None:
    """The CPUs of -C/--cpu-mask (hex) and -Cr/--cpu-range (lo-hi), None when neither is given."""
    cpus: set[int] = set()
    if args.cpu_mask:
        try:
            mask = int(args.cpu_mask, 16)
        except ValueError:
            raise ArgError("--cpu-mask", f"invalid hex mask: {args.cpu_mask}")
        cpus |= {i for i in range(mask.bit_length()) if mask >> i & 1}
    if args.cpu_range:
        try:
            lo, hi = (int(x) for x in args.cpu_range.split("-"))
        except ValueError:
            raise ArgError("--cpu-range", f"expected LO-HI, got: {args.cpu_range}")
        cpus |= set(range(lo, hi + 1))
    return cpus or None


def _read(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ArgError(flag, f"error: failed to open file '{path}': {e.strerror}")


def _default_grammar(args: argparse.Namespace) -> str:
    """GBNF text of --grammar / --grammar-file / --json-schema / --json-schema-file ("" = none),
    checked at start-up so that a bad one stops the server rather than failing every request."""
    import json

    from grammar import GrammarError, json_schema_to_gbnf, parse_gbnf
    given = [(f, v) for f, v in (("--grammar", args.grammar), ("--grammar-file", args.grammar_file),
                                 ("--json-schema", args.json_schema), ("--json-schema-file", args.json_schema_file))
             if v is not None]
    if not given:
        return ""
    if len(given) > 1:
        raise ArgError(given[1][0], "only one of --grammar, --grammar-file, --json-schema, --json-schema-file")
    flag, value = given[0]
    text = _read(flag, value) if flag.endswith("-file") else value
    try:
        if flag.startswith("--json-schema"):
            try:
                text = json_schema_to_gbnf(json.loads(text))
            except GrammarError as e:  # common/arg.cpp's message
                raise ArgError(flag, f"JSON schema conversion failed:\n{e}") from None
        parse_gbnf(text)
    except (GrammarError, ValueError) as e:
        raise ArgError(flag, str(e))
    return text


def _unsupported(args: argparse.Namespace) -> str | None:
    for names, _ in _UNSUPPORTED:
        if getattr(args, _dest("_unsupported_", names)) is not None:
            return names[-1]
    return None


def lora_adapters(args: argparse.Namespace) -> list[tuple[str, float]]:
    """--lora and --lora-scaled as (path, scale), in command-line order (adapter ids follow it)."""
    out: list[tuple[str, float]] = []
    for flag, value in args.lora:
        if flag == "--lora":
            out += [(item, 1.0) for item in value.split(",") if item]
            continue
        for item in value.split(","):
            parts = item.split(":")
            if len(parts) != 2:
                raise ArgError("--lora-scaled", "lora-scaled format: FNAME:SCALE")
            try:
                out.append((parts[0], float(parts[1])))
            except ValueError:
                raise ArgError("--lora-scaled", f"invalid scale: {parts[1]}")
    return out


def _kv_dtype(args: argparse.Namespace) -> str:
    types = {args.cache_type_k.lower(), args.cache_type_v.lower()}
    if len(types) != 1 or not types <= {"f16", "f32", "bf16"}:
        raise ArgError("--cache-type-k", f"unsupported KV cache types {args.cache_type_k}/{args.cache_type_v}: "
                                         "tritium keeps K and V alike in f16, f32 or bf16")
    return types.pop()


def _rope_overrides(args: argparse.Namespace) -> dict:
    """Model config fields the RoPE flags override (as llama.cpp's cparams do)."""
    o: dict = {}
    if args.rope_scaling is not None:
        o["rope_scaling_type"] = args.rope_scaling
    if args.rope_freq_base:
        o["rope_freq_base"] = args.rope_freq_base
    if args.rope_scale:
        o["rope_scaling_factor"] = args.rope_scale
    if args.rope_freq_scale:
        o["rope_scaling_factor"] = 1.0 / args.rope_freq_scale
    for flag, key in (("yarn_orig_ctx", "rope_scaling_orig_ctx"), ("yarn_ext_factor", "yarn_ext_factor"),
                      ("yarn_attn_factor", "yarn_attn_factor"), ("yarn_beta_slow", "yarn_beta_slow"),
                      ("yarn_beta_fast", "yarn_beta_fast")):
        if getattr(args, flag) is not None:
            o[key] = getattr(args, flag)
    return o


def _api_keys(args: argparse.Namespace) -> list[str]:
    keys = [k for k in (args.api_key or "").split(",") if k]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise ArgError("--api-key-file", f"error: failed to open file '{args.api_key_file}': {e.strerror}")
    return keys


def _logit_bias(value: str) -> tuple[int, float]:
    """`-l 15043+1` / `15043-1` (common/arg.cpp: the id, a sign, then a float)."""
    from api.params import f32

    m = re.fullmatch(r"\s*([+-]?\d+)\s*([+-])(.*)", value, re.S)
    num = m and re.match(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", m.group(3))  # std::stof: a prefix
    if not num:
        raise ArgError("--logit-bias", "invalid input format")
    return int(m.group(1)), f32(float(num.group(0)) * (-1.0 if m.group(2) == "-" else 1.0))


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig of parsed arguments; raises ArgError like llama-server."""
    from api.params import f32
    from api.server import ServerConfig

    if args.public_path and args.ui and not os.path.isdir(args.public_path):  # b1: set_mount_point fails
        raise ArgError("--path", f"static assets path not found: {args.public_path}")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise ArgError("--slot-save-path", f"not a directory: {args.slot_save_path}")
    if args.chat_template_file is not None and not os.path.isfile(args.chat_template_file):
        raise ArgError("--chat-template-file", f"error: failed to open file '{args.chat_template_file}'")
    flag = _unsupported(args)
    if flag is not None:
        raise ArgError(flag, "not supported by tritium")
    _kv_dtype(args)
    _cpu_set(args)
    lora_adapters(args)
    grammar = _default_grammar(args)
    logit_bias = [_logit_bias(v) for v in args.logit_bias]
    d = SamplingParams()
    defaults = SamplingParams(
        temperature=f32(args.temp), top_k=args.top_k, top_p=f32(args.top_p), min_p=f32(args.min_p),
        typical_p=f32(args.typical), seed=args.seed & 0xFFFFFFFF, repeat_penalty=f32(args.repeat_penalty),
        repeat_last_n=args.repeat_last_n, presence_penalty=f32(args.presence_penalty),
        frequency_penalty=f32(args.frequency_penalty),
        dynatemp_range=f32(args.dynatemp_range), dynatemp_exponent=f32(args.dynatemp_exp),
        xtc_probability=f32(args.xtc_probability), xtc_threshold=f32(args.xtc_threshold),
        top_n_sigma=f32(args.top_nsigma), min_keep=args.min_keep, ignore_eos=args.ignore_eos,
        mirostat=args.mirostat, mirostat_tau=f32(args.mirostat_ent), mirostat_eta=f32(args.mirostat_lr),
        logit_bias=logit_bias,
        dry_multiplier=f32(args.dry_multiplier), dry_base=f32(args.dry_base),
        dry_allowed_length=args.dry_allowed_length, dry_penalty_last_n=args.dry_penalty_last_n,
        samplers=[s for s in args.samplers.split(";") if s] if args.samplers else list(d.samplers),
        grammar=grammar)
    return ServerConfig(
        model_path=args.model or "", port=args.port, api_keys=_api_keys(args), **cli_net.net_settings(args),
        max_body_size=args.max_body_size, read_timeout=float(args.timeout), shutdown_timeout=args.shutdown_timeout,
        metrics=args.metrics, slots=args.slots, props=args.props, slot_save_path=args.slot_save_path,
        sse_ping_interval=args.sse_ping_interval, embeddings=args.embeddings or args.reranking,
        pooling="rank" if args.reranking else args.pooling,
        embd_normalize=args.embd_normalize, jinja=args.jinja, reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget, enable_thinking={"on": True, "off": False}.get(args.reasoning or ""),
        n_predict=args.n_predict, defaults=defaults, ui=args.ui, public_path=args.public_path,
        verbose=args.verbose or args.verbosity > 9, media_path=_media_path(args),
        media_marker=os.environ.get("LLAMA_MEDIA_MARKER", ""))  # llama-server's: a fixed marker


def _media_path(args: argparse.Namespace) -> str:
    """--media-path: a folder (llama-server's "not a directory"), with a trailing separator."""
    path = args.media_path or ""
    if path and not os.path.isdir(path):
        raise ArgError("--media-path", f"not a directory: {path}")
    return path if not path or path.endswith(os.sep) else path + os.sep


def engine_config(args: argparse.Namespace, scfg: ServerConfig, preload: Preload | None = None):
    """The EngineConfig of parsed arguments (imports the engine, hence torch); `preload`: the read
    of -m started by `start_preload`, which the load takes."""
    from runtime.serving import EngineConfig

    device = args.device  # "auto" is resolved by the engine
    return EngineConfig(
        model_path=args.model, n_ctx=args.ctx_size, n_parallel=args.parallel,
        kv_unified=True if args.kv_unified else None, swa_full=args.swa_full, ctx_checkpoints=args.ctx_checkpoints,
        n_threads=args.threads, device=device,
        cache_ram_mib=args.cache_ram, cache_reuse=args.cache_reuse, cache_idle_slots=args.cache_idle_slots,
        sleep_idle_seconds=args.sleep_idle_seconds,
        slot_prompt_similarity=args.slot_prompt_similarity, slot_save_path=args.slot_save_path,
        embeddings=args.embeddings or args.reranking, n_predict=args.n_predict, defaults=scfg.defaults,
        chat_template=args.chat_template, chat_template_file=args.chat_template_file,
        verbosity=verbosity(args), n_batch=max(1, args.batch_size), n_ubatch=max(1, args.ubatch_size), kv_dtype=_kv_dtype(args), warmup=args.warmup,
        config_overrides=_rope_overrides(args), lora=lora_adapters(args),
        lora_init_without_apply=args.lora_init_without_apply, preload=preload,
        numerics=args.numerics,  # None: TRITIUM_FAST_NUMERICS decides (bootstrap.resolve_config)
        mmproj=args.mmproj, mmproj_offload=args.mmproj_offload and (args.mmproj_device or "").lower() != "none",
        image_min_tokens=args.image_min_tokens, image_max_tokens=args.image_max_tokens)


def start_preload(args: argparse.Namespace) -> Preload | None:
    """The read of -m started while the rest of the server imports (runtime/launch/start.py)."""
    try:
        n_ranks = tp_size(args)
    except ArgError:  # reported by main
        return None
    return launch.preload(args.model, args.device, n_ranks, bool(args.hf_repo))


def verbosity(args: argparse.Namespace) -> int:
    if args.log_disable:
        return -1
    return 4 if args.verbose else args.verbosity


def _speculative_warning(args: argparse.Namespace, log: Logger) -> None:
    if any(getattr(args, _dest("_spec_", names)) is not None for names, _ in _SPECULATIVE):
        log.srv("W", "llama_server", "speculative decoding is not supported: the draft model options are ignored "
                                     "(same output, decoded without a draft)")


def tp_size(args: argparse.Namespace) -> int:
    """Ranks asked for: -tp N, else llama-server's row split over the -ts shares, else torchrun's
    WORLD_SIZE, else 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    n = args.tensor_parallel_size
    if n is None and (getattr(args, _dest("_noeffect_", ("-sm", "--split-mode"))) or "") == "row":
        shares = getattr(args, _dest("_noeffect_", ("-ts", "--tensor-split"))) or ""
        n = sum(1 for x in shares.replace("/", ",").split(",") if x.strip() and float(x) > 0) or None
    if n is None:
        return world
    if n < 1 or (world > 1 and n != world):
        raise ArgError("--tensor-parallel-size", f"{n} ranks asked for, but WORLD_SIZE is {world}")
    return n


SWITCH_INTERVAL_S = 0.0005


def main(argv: list[str] | None = None) -> int:
    # as llama-server: "--backend_sampling" is "--backend-sampling"
    argv = [a.replace("_", "-") if a.startswith("--") else a for a in (sys.argv[1:] if argv is None else argv)]
    args = build_parser().parse_args(argv)
    # no cyclic garbage collection while starting: the imports and the tokenizer make ~2M objects,
    # and the collections they trigger cost ~0.3 s of the load (qwen2.5 0.5B); `load` freezes
    # what the start made (never traversed again: shorter pauses while serving) and re-enables it
    gc.disable()
    # the event loop's thread waits at most this long for the GIL while worker threads render a
    # 100k-message chat or tokenize megabytes (Python's 5 ms default: /health took ~20 ms each)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    preload = start_preload(args)  # before the imports below (torch, the web stack): ~1.3 s
    try:
        scfg = server_config(args)
        n_ranks = tp_size(args)
        cpus = _cpu_set(args)
    except ArgError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
    log = Logger(verbosity(args), log_file=args.log_file)

    def say(level: str, msg: str) -> None:
        log.srv(level, "llama_server", msg)
    launch.pin_process(cpus, args.prio, say)
    _speculative_warning(args, log)
    if args.hf_repo:
        path = launch.fetch_hf(args.hf_repo, args.hf_file, args.hf_token, args.offline, say)
        if path is None:
            return 1
        args.model = scfg.model_path = path
        scfg.alias = scfg.alias or args.hf_repo
    if args.mmproj_url and not args.mmproj:  # -mmu
        args.mmproj = launch.fetch_url(args.mmproj_url, args.offline, say)
        if args.mmproj is None:
            return 1
    if n_ranks > 1 and int(os.environ.get("RANK", "0")) > 0:
        gc.enable()
        ecfg = engine_config(args, scfg)
        ecfg.log = log.raw
        launch.serve_rank(ecfg, log.raw)
        return 0
    if n_ranks > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        launch.start_ranks(n_ranks, list(sys.argv[1:] if argv is None else argv), say)
    log.srv("I", "llama_server", "initializing ...")
    log.log("I", "cmn", "common_params_print_info",
            f"common_params_print_info: verbosity = {log.verbosity} (adjust with the `-lv N` CLI arg)")
    for w in cli_net.warnings(args, cli_net.net_settings(args)):
        log.srv("W", "llama_server", w)
    if not scfg.api_keys:
        log.srv("W", "llama_server", "security: no API key is set and CORS allows all origins (see https://github.com/ggml-org/llama.cpp/pull/25655)"
                if scfg.cors_origins == "*" else "security: no API key is set")

    socks = []
    port = scfg.port
    from api.routes.gcp import gcp_settings
    from api.server import create_app

    gcp = gcp_settings()
    if gcp.enabled:  # Vertex AI gives the port in the environment
        if port != gcp.port:
            log.srv("W", "llama_server", f"Google Cloud Platform compat: overriding server port {port} with "
                                         f"AIP_HTTP_PORT {gcp.port}")
        port = gcp.port
    for host in scfg.hosts:  # every --host address, on the same port (the first one's when --port 0)
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if ":" in host and len(scfg.hosts) > 1:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # "::" binds IPv6 only
            # inherited by accepted connections: without it a keep-alive client waits ~40 ms for every
            # response after the first (Nagle against delayed ACKs)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((host, port))
            sock.listen(512)
        except OSError as e:
            log.srv("E", "llama_server", f"couldn't bind HTTP server socket, hostname: {host}, port: {port}: {e}")
            for s in socks:
                s.close()
            return 1
        port = sock.getsockname()[1]
        socks.append(sock)

    import uvicorn

    app = create_app(scfg, None, log)  # the engine is attached by the loader thread
    server = app.state.server
    from api.shutdown import DrainingServer, header_timeout_protocol

    served = app
    if args.api_prefix:
        from api.server import PrefixedApp

        served = PrefixedApp(app, args.api_prefix)
    tls = {"ssl_keyfile": args.ssl_key_file, "ssl_certfile": args.ssl_cert_file} \
        if args.ssl_key_file and args.ssl_cert_file else {}
    uv = DrainingServer(uvicorn.Config(served, log_level="warning", access_log=False, server_header=False, timeout_keep_alive=args.timeout,
                                       lifespan="off", http=header_timeout_protocol(args.header_timeout),
                                       timeout_graceful_shutdown=5, **tls),
                        app.state.drain, args.shutdown_timeout, lambda m: log.srv("I", "llama_server", m))
    failed: list[BaseException] = []

    def loaded(ecfg, engine) -> None:
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

    def load() -> None:
        try:
            ecfg = engine_config(args, scfg, preload)
            ecfg.log = log.raw
            launch.start_engine(ecfg, lambda engine: setattr(server, "engine", engine),
                                lambda engine: loaded(ecfg, engine))
            server.set_ready()
            log.srv("I", "llama_server", "model loaded")
            for host in scfg.hosts:
                scheme = "https" if tls else "http"
                log.srv("I", "llama_server", f"listening on {scheme}://{f'[{host}]' if ':' in host else host}:{port}")
            if port == 8080:
                log.srv("W", "llama_server", "notice: server default port will be changed to :9931 in a future "
                                             "release (ref: https://github.com/ggml-org/llama.cpp/pull/26508)")
        except BaseException as e:  # noqa: BLE001 - reported, then the server exits
            failed.append(e)
            log.srv("E", "llama_server", f"exiting due to model loading error: {e}")
            uv.should_exit = True
        finally:
            gc.freeze()
            gc.enable()

    threading.Thread(target=load, name="tritium-load", daemon=True).start()
    try:
        uv.run(sockets=socks)
    finally:
        if server.engine is not None:
            server.engine.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

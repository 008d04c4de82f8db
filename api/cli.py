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
from api.cli_args import ArgError, Exit, build_parser, refusal
from api.log import Logger
from api.cli_spec import is_falsey, is_truthy
from runtime.launch import router_child
from runtime.launch import start as launch
from runtime.tasks import SamplingParams

if TYPE_CHECKING:
    from api.server import ServerConfig
    from runtime.launch.preload import Preload

# This module imports neither torch nor the web stack: `main` starts reading the model
# (runtime/launch/preload.py) before they are imported, in the functions that need them.

__all__ = ["ArgError", "build_parser", "main", "server_config", "engine_config", "lora_adapters", "tp_size"]


def _cpu_set(args: argparse.Namespace) -> set[int] | None:
    """The CPUs of -C/--cpu-mask and -Cr/--cpu-range (parsed as llama.cpp parses them), None when
    neither names any."""
    return set(args.cpu_set) or None


def _default_grammar(args: argparse.Namespace) -> str:
    """GBNF text of the last of --grammar / --grammar-file / --json-schema / --json-schema-file
    ("" = none; -j's schema was converted while parsing), checked at start-up so that a bad one
    stops the server rather than failing every request."""
    if args.grammar_source is None:
        return ""
    from grammar import GrammarError, parse_gbnf

    flag, text = args.grammar_source
    try:
        parse_gbnf(text)
    except (GrammarError, ValueError) as e:
        raise ArgError(flag, str(e))
    return text


def lora_adapters(args: argparse.Namespace) -> list[tuple[str, float]]:
    """--lora and --lora-scaled as (path, scale), in command-line order (adapter ids follow it)."""
    return list(args.lora)


def _kv_types(args: argparse.Namespace) -> tuple[str, str]:
    """(-ctk, -ctv): llama.cpp's cache type names (f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1), K and V
    each its own."""
    return args.cache_type_k, args.cache_type_v


def _rope_overrides(args: argparse.Namespace) -> dict:
    """Model config fields the RoPE flags override (as llama.cpp's cparams do)."""
    o: dict = {}
    if args.rope_scaling is not None:
        o["rope_scaling_type"] = args.rope_scaling
    if args.rope_freq_base:
        o["rope_freq_base"] = args.rope_freq_base
    if args.rope_freq_scale:  # --rope-scale N is --rope-freq-scale 1/N (arg.cpp)
        o["rope_scaling_factor"] = 1.0 / args.rope_freq_scale
    for flag, key in (("yarn_orig_ctx", "rope_scaling_orig_ctx"), ("yarn_ext_factor", "yarn_ext_factor"),
                      ("yarn_attn_factor", "yarn_attn_factor"), ("yarn_beta_slow", "yarn_beta_slow"),
                      ("yarn_beta_fast", "yarn_beta_fast")):
        if getattr(args, flag) is not None:
            o[key] = getattr(args, flag)
    return o


def _api_keys(args: argparse.Namespace) -> list[str]:
    return list(args.api_keys)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig of parsed arguments; raises ArgError like llama-server."""
    from api.context import RequestDefaults
    from api.params import KNOWN_SAMPLERS, f32
    from api.server import ServerConfig

    if args.public_path and args.ui and not os.path.isdir(args.public_path):  # b1: set_mount_point fails
        raise ArgError("--path", f"static assets path not found: {args.public_path}")
    refused = refusal(args)  # a flag whose value needs what tritium lacks (quantized KV, router, ...)
    if refused is not None:
        raise refused
    grammar = _default_grammar(args)
    logit_bias = [(tok, f32(bias)) for tok, bias in args.logit_bias]
    breakers = args.dry_sequence_breakers
    if args.escape:  # llama.cpp processes escapes in the DRY breakers and the reverse prompts (-e, default on)
        breakers = [process_escapes(b) for b in breakers]
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
        dry_sequence_breakers=breakers, samplers=[s for s in args.samplers if s in KNOWN_SAMPLERS],
        grammar=grammar, reasoning_budget_tokens=args.reasoning_budget)
    return ServerConfig(
        model_path=args.model or "", port=args.port, api_keys=_api_keys(args), **cli_net.net_settings(args),
        max_body_size=args.max_body_size, read_timeout=float(args.timeout), shutdown_timeout=args.shutdown_timeout,
        metrics=args.metrics, slots=args.slots, props=args.props, slot_save_path=args.slot_save_path,
        sse_ping_interval=args.sse_ping_interval, embeddings=args.embeddings, pooling=args.pooling,
        embd_normalize=args.embd_normalize, jinja=args.jinja, reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget, enable_thinking={"on": True, "off": False}.get(args.reasoning or ""),
        n_predict=args.n_predict, defaults=defaults, ui=args.ui, public_path=args.public_path,
        verbose=args.verbose or args.verbosity > 9, ui_settings=_ui_settings(args),
        media_path=args.media_path or "",  # checked and given its separator while parsing
        media_marker=os.environ.get("LLAMA_MEDIA_MARKER", ""),  # llama-server's: a fixed marker
        request_defaults=RequestDefaults(
            n_keep=args.n_keep, cache_prompt=args.cache_prompt,
            stop=[process_escapes(s) if args.escape else s for s in args.antiprompt]),
        prefill_assistant=args.prefill_assistant, spm_infill=args.spm_infill,
        reasoning_budget_message=args.reasoning_budget_message, template_kwargs=dict(args.template_kwargs),
        preserve_reasoning_specified=args.preserve_reasoning_specified, skip_chat_parsing=args.skip_chat_parsing,
        spec_types=_spec_types_echo(args))


def _spec_types_echo(args: argparse.Namespace) -> str:
    """--spec-type as llama-server echoes it: its default `none`, then each value's types as given
    (a value naming `none` adds `none`), as arg.cpp appends them."""
    names = ["none"]
    for v in args.spec_type or ():
        got = v.split(",")
        names += ["none"] if "none" in got else got
    return ",".join(names)


def engine_config(args: argparse.Namespace, scfg: ServerConfig, preload: Preload | None = None):
    """The EngineConfig of parsed arguments (imports the engine, hence torch); `preload`: the read
    of -m started by `start_preload`, which the load takes."""
    from runtime.serving import EngineConfig

    device = args.device  # "auto" is resolved by the engine
    n_ctx = args.ctx_size
    if args.kv_unified_per_slot > 0 and "-c" not in args.given:  # b1: the pool is n_parallel * N tokens
        n_ctx = (args.parallel if args.parallel > 0 else 4) * args.kv_unified_per_slot
    return EngineConfig(
        model_path=args.model, n_ctx=n_ctx, n_parallel=args.parallel,
        kv_unified=args.kv_unified, kv_unified_per_slot=args.kv_unified_per_slot,
        swa_full=args.swa_full, ctx_checkpoints=args.ctx_checkpoints,
        n_threads=args.threads, device=device,
        cache_ram_mib=args.cache_ram, cache_reuse=args.cache_reuse, cache_idle_slots=args.cache_idle_slots,
        sleep_idle_seconds=args.sleep_idle_seconds,
        slot_prompt_similarity=args.slot_prompt_similarity, slot_save_path=args.slot_save_path,
        embeddings=args.embeddings, n_predict=args.n_predict, defaults=scfg.defaults, special=args.special,
        ctx_shift=args.ctx_shift,
        flash_attn="off" if is_falsey(args.flash_attn) else "on" if is_truthy(args.flash_attn) else "auto",
        chat_template=args.chat_template, chat_template_file=args.chat_template_file,
        verbosity=verbosity(args), n_batch=max(1, args.batch_size), n_ubatch=max(1, args.ubatch_size), kv_dtype=_kv_types(args)[0], kv_type_v=_kv_types(args)[1], warmup=args.warmup,
        config_overrides=_rope_overrides(args), lora=lora_adapters(args),
        lora_init_without_apply=args.lora_init_without_apply, preload=preload,
        numerics=args.numerics,  # None: TRITIUM_FAST_NUMERICS decides (bootstrap.resolve_config)
        mmproj=args.mmproj, mmproj_offload=args.mmproj_offload and (args.mmproj_device or "").lower() != "none",
        image_min_tokens=args.image_min_tokens, image_max_tokens=args.image_max_tokens, spec=spec_config(args))


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


def spec_config(args: argparse.Namespace):
    """runtime.serving.spec.SpecConfig of the --spec-* flags, checked as common/arg.cpp checks them."""
    from runtime.spec_config import NgramMapParams, NgramModParams, SpecConfig, SpecType, parse_spec_types

    types: list = []
    for value in args.spec_type or ():
        try:
            got = parse_spec_types(value)
        except ValueError as e:
            raise ArgError("--spec-type", str(e)) from None
        if SpecType.NONE in got:  # "none" anywhere in a value clears that value's list
            got = ()
        types.extend(t for t in got if t not in types)
    if args.spec_draft_n_max < 0:
        raise ArgError("--spec-draft-n-max", "invalid value")

    def ngram(name: str) -> NgramMapParams:
        key = name.replace("-", "_")
        n, m, hits = (getattr(args, f"spec_ngram_{key}_{f}") for f in ("size_n", "size_m", "min_hits"))
        if not 1 <= n <= 1024:
            raise ArgError(f"--spec-ngram-{name}-size-n", "ngram size N must be between 1 and 1024 inclusive")
        if not 1 <= m <= 1024:
            raise ArgError(f"--spec-ngram-{name}-size-m", "ngram size M must be between 1 and 1024 inclusive")
        if hits < 1:
            raise ArgError(f"--spec-ngram-{name}-min-hits", "ngram min hits must be at least 1")
        return NgramMapParams(n, m, hits)

    for flag, v, lo in (("--spec-ngram-mod-n-min", args.spec_ngram_mod_n_min, 0),
                        ("--spec-ngram-mod-n-max", args.spec_ngram_mod_n_max, 0),
                        ("--spec-ngram-mod-n-match", args.spec_ngram_mod_n_match, 1)):
        if not lo <= v <= 1024:
            what = {"--spec-ngram-mod-n-min": "ngram n-min", "--spec-ngram-mod-n-max": "ngram n-max"}.get(flag, "ngram size N")
            raise ArgError(flag, f"{what} must be between {lo} and 1024 inclusive")
    return SpecConfig(tuple(types), args.spec_draft_n_max, args.spec_draft_n_min, ngram("simple"), ngram("map-k"),
                      ngram("map-k4v"), NgramModParams(args.spec_ngram_mod_n_match, args.spec_ngram_mod_n_max,
                                                       args.spec_ngram_mod_n_min),
                      draft_model=args.spec_draft_model or None, draft_p_min=args.spec_draft_p_min,
                      draft_cache_type_k=args.spec_draft_type_k, draft_cache_type_v=args.spec_draft_type_v,
                      lookup_cache_static=args.lookup_cache_static, lookup_cache_dynamic=args.lookup_cache_dynamic)


def _speculative_warning(args: argparse.Namespace, log: Logger) -> None:
    if args.speculative:
        log.srv("W", "llama_server", "speculative decoding is not supported: the draft model options are ignored "
                                     "(same output, decoded without a draft)")


def preserve_reasoning_notes(scfg: ServerConfig, tmpl) -> list[tuple[str, str]]:
    """What llama-server logs at load about --reasoning-preserve and the template (server_context::init)."""
    supported = bool((getattr(tmpl, "caps", None) or {}).get("supports_preserve_reasoning"))
    specified = scfg.preserve_reasoning_specified
    enabled = scfg.template_kwargs.get("preserve_reasoning", "true") == "true"
    out = []
    if supported and not specified:
        out.append(("W", "chat template supports preserving reasoning, it is enabled by default (may use more "
                         "tokens, disable via --no-reasoning-preserve)"))
    if supported and not enabled:
        out.append(("I", "chat template supports preserving reasoning, consider enabling it via --reasoning-preserve"))
    if not supported and specified and enabled:
        out.append(("W", "chat template does NOT support preserving reasoning, --reasoning-preserve has no effect"))
    return out


def _ui_settings(args: argparse.Namespace) -> dict:
    """--ui-config / --ui-config-file: the web UI's default settings (/props ui_settings)."""
    if args.ui_config is None:
        return {}
    from api.cli_opts_server import json_value
    from api.cli_spec import Invalid

    try:
        value = json_value(args.ui_config)
    except Invalid as e:
        raise ArgError("--ui-config", f"failed to parse UI config: {e}") from None
    return value if isinstance(value, dict) else {}


def process_escapes(text: str) -> str:
    """common's string_process_escapes: \\n \\r \\t \\' \\" \\\\ \\xHH (other escapes kept as written)."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            simple = {"n": "\n", "t": "\t", "'": "'", '"': '"', "r": "\r", "\\": "\\"}
            if n in simple:
                out.append(simple[n])
                i += 2
                continue
            if n == "x" and i + 3 < len(text) and all(ch in "0123456789abcdefABCDEF" for ch in text[i + 2:i + 4]):
                out.append(chr(int(text[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(c + n)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def tp_size(args: argparse.Namespace) -> int:
    """Ranks asked for: -tp N, else llama-server's row split over the -ts shares, else torchrun's
    WORLD_SIZE, else 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    n = args.tensor_parallel_size
    if n is None and args.split_mode == "row":
        n = sum(1 for x in (args.tensor_split or []) if x > 0) or None
    if n is None:
        return world
    if n < 1 or (world > 1 and n != world):
        raise ArgError("--tensor-parallel-size", f"{n} ranks asked for, but WORLD_SIZE is {world}")
    return n


SWITCH_INTERVAL_S = 0.0005


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)  # llama-server's parser: LLAMA_ARG_* variables, then argv
    except Exit as e:  # --help, --version, --list-devices, ...
        sys.stdout.write(e.stdout)
        sys.stdout.flush()
        sys.stderr.write(e.stderr)
        sys.stderr.flush()
        return e.code
    except ArgError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
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
        spec_config(args)  # (checked before the load; engine_config builds it again)
        n_ranks = tp_size(args)
        cpus = _cpu_set(args)
    except ArgError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
    from api.router_cli import is_router_mode, run_router
    if is_router_mode(args):  # no model: several, each in a worker process (api/router_cli.py)
        gc.enable()
        return run_router(args, argv, scfg)
    log = Logger(verbosity(args), log_file=args.log_file)

    def say(level: str, msg: str) -> None:
        log.srv(level, "llama_server", msg)
    launch.pin_process(cpus, args.prio, say)
    _speculative_warning(args, log)
    if args.hf_repo:
        got = launch.fetch_hf(args.hf_repo, args.hf_file, args.hf_token, args.offline, say,
                              mmproj=args.mmproj_auto and not args.mmproj and not args.mmproj_url)
        if got is None:
            return 1
        path, args.mmproj = got[0], args.mmproj or got[1]
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
            if args.reuse_port and hasattr(socket, "SO_REUSEPORT"):  # --reuse-port
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
        for level, msg in preserve_reasoning_notes(scfg, engine.chat_template):
            log.srv(level, "init", msg)
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
            router_child.loading(0.0)
            launch.start_engine(ecfg, lambda engine: setattr(server, "engine", engine),
                                lambda engine: loaded(ecfg, engine))
            server.set_ready()
            log.srv("I", "llama_server", "model loaded")
            if router_child.is_child():  # a router's worker: tell it (runtime/launch/router_child.py)
                from api.routes.props import model_data
                router_child.loading(1.0)
                router_child.notify("ready", model_data(server))
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

    if router_child.is_child():
        router_child.watch_stdin(lambda m: log.srv("I", "setup", m))
    threading.Thread(target=load, name="tritium-load", daemon=True).start()
    try:
        uv.run(sockets=socks)
    finally:
        if server.engine is not None:
            server.engine.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

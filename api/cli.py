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

from api import cli_net
from api.routes.gcp import gcp_settings
from api.server import ServerConfig, create_app
from api.log import Logger
from api.params import f32
from runtime.chat import REASONING_FORMATS
from runtime.tasks import SamplingParams

POOLING = ("none", "mean", "cls", "last", "rank")


class ArgError(Exception):
    def __init__(self, flag: str, message: str):
        super().__init__(f'error while handling argument "{flag}": {message}')


def build_parser() -> argparse.ArgumentParser:
    d = SamplingParams()
    p = argparse.ArgumentParser(
        prog="tritium-server", allow_abbrev=False,
        description="A llama-server compatible LLM inference server (OpenAI-compatible and native endpoints).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model and context")
    g.add_argument("-m", "--model", default=None, metavar="FNAME",
                   help="model path (GGUF file or Hugging Face folder); without it a built-in tiny model is used")
    g.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="<user>/<model>[:quant]",
                   help="Hugging Face model repository; quant is optional, case-insensitive, default to Q4_K_M, "
                        "or falls back to the first file in the repo if Q4_K_M doesn't exist")
    g.add_argument("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE",
                   help="Hugging Face model file; overrides the quant in --hf-repo")
    g.add_argument("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
                   help="Hugging Face access token (default: value from HF_TOKEN environment variable)")
    g.add_argument("--offline", action="store_true", help="offline mode: forces use of cache, prevents network access")
    # one list for both, in command-line order (llama.cpp appends to one list of adapters)
    g.add_argument("--lora", dest="lora", action="append", default=[], type=lambda v: ("--lora", v), metavar="FNAME",
                   help="path to LoRA adapter (use comma-separated values to load multiple adapters)")
    g.add_argument("--lora-scaled", dest="lora", action="append", type=lambda v: ("--lora-scaled", v),
                   metavar="FNAME:SCALE,...",
                   help="path to LoRA adapter with user defined scaling (format: FNAME:SCALE,...)")
    g.add_argument("--lora-init-without-apply", action="store_true",
                   help="load LoRA adapters without applying them (apply later via POST /lora-adapters)")
    g.add_argument("-a", "--alias", default=None,
                   help="model name aliases, comma-separated; the first in sorted order names the model in responses")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N",
                   help="size of the prompt context, 0 = loaded from the model")
    g.add_argument("-np", "--parallel", type=int, default=-1, metavar="N",
                   help="number of server slots (-1 = auto: 4 slots sharing a unified KV cache)")
    g.add_argument("-kvu", "--kv-unified", action="store_true", default=False,
                   help="use a single unified KV buffer shared by all slots")
    g.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="number of tokens to predict (-1 = until end of generation or context)")
    g.add_argument("-t", "--threads", type=int, default=-1, metavar="N", help="CPU threads (-1 = torch default)")
    g.add_argument("-tp", "--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="split the model across N ranks (torch.distributed: gloo on the CPU, NCCL on CUDA); "
                        "started here on one machine, or by torchrun across machines "
                        "(`-sm row -ts A,B,...` asks for the same, one rank per non-zero share)")
    g.add_argument("-dev", "--device", default="auto", type=_device, metavar="{auto,cpu,cuda}",
                   help="where the model runs (auto = cuda when available); llama-server's device lists are "
                        "understood too: none = cpu, CUDA0 = cuda")
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
    g.add_argument("--min-keep", type=int, default=d.min_keep, metavar="N")
    g.add_argument("--top-nsigma", "--top-n-sigma", type=float, default=d.top_n_sigma, metavar="N")
    g.add_argument("--xtc-probability", type=float, default=d.xtc_probability, metavar="N")
    g.add_argument("--xtc-threshold", type=float, default=d.xtc_threshold, metavar="N")
    g.add_argument("--dynatemp-range", type=float, default=d.dynatemp_range, metavar="N")
    g.add_argument("--dynatemp-exp", type=float, default=d.dynatemp_exponent, metavar="N")
    g.add_argument("--dry-multiplier", type=float, default=d.dry_multiplier, metavar="N")
    g.add_argument("--dry-base", type=float, default=d.dry_base, metavar="N")
    g.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length, metavar="N")
    g.add_argument("--dry-penalty-last-n", type=int, default=d.dry_penalty_last_n, metavar="N")
    g.add_argument("--ignore-eos", action="store_true", help="ignore end of generation tokens by default")
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="GBNF grammar for every request that brings no grammar or json_schema of its own")
    g.add_argument("--grammar-file", default=None, metavar="FNAME", help="file holding that GBNF grammar")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="JSON schema for every request that brings no grammar or json_schema of its own")
    g.add_argument("-jf", "--json-schema-file", default=None, metavar="FNAME", help="file holding that JSON schema")

    g = p.add_argument_group("server")
    g.add_argument("--port", type=int, default=8080, help="port to listen on")
    g.add_argument("--api-key", default=None, metavar="KEY", help="API key(s), comma-separated")
    g.add_argument("--api-key-file", default=None, metavar="FNAME", help="file with one API key per line")
    g.add_argument("--timeout", "-to", type=int, default=600, metavar="N", help="HTTP keep-alive timeout in seconds")
    g.add_argument("--max-body-size", type=int, default=32 << 20, metavar="BYTES",
                   help="largest request body accepted; a larger one is a 413 (tritium; 0 = no limit)")
    g.add_argument("--header-timeout", type=float, default=10.0, metavar="N",
                   help="seconds a client may take to send a request's headers (tritium; 0 = no limit)")
    g.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="N",
                   help="on SIGTERM, seconds running requests get to finish before they are ended (tritium)")
    g.add_argument("--metrics", action="store_true", help="enable the Prometheus /metrics endpoint")
    g.add_argument("--ui", "--webui", dest="ui", action="store_true", default=True, help="serve the web chat page at /")
    g.add_argument("--no-ui", "--no-webui", dest="ui", action="store_false", help="no web chat page")
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
    g.add_argument("--cache-idle-slots", dest="cache_idle_slots", action="store_true", default=True,
                   help="save idle slots to the prompt cache on new task, and clear them when using unified KV "
                        "(default: enabled, requires cache-ram)")
    g.add_argument("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false")
    g.add_argument("--sleep-idle-seconds", type=_sleep_seconds, default=-1, metavar="SECONDS",
                   help="number of seconds of idleness after which the server will sleep (-1 = disabled)")
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
    g.add_argument("--reasoning-format", "-rf", default="auto", choices=REASONING_FORMATS,
                   help="where reasoning text goes: none keeps it in content, deepseek puts it in reasoning_content")
    g.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="thinking tokens allowed (-1 = unlimited, 0 = end thinking at once)")
    g.add_argument("--reasoning", "-rea", default=None, choices=("on", "off", "auto"),
                   help="set enable_thinking for every request")
    _add_llama_server_flags(p)
    cli_net.add_net_flags(p)
    return p


def _device(v: str) -> str:
    """--device: tritium's auto|cpu|cuda, or a llama-server device list (none, CUDA0, ...)."""
    low = v.strip().lower()
    if low in ("auto", "cpu", "cuda"):
        return low
    if low in ("none", ""):
        return "cpu"
    if low.startswith("cuda"):
        return "cuda"
    raise argparse.ArgumentTypeError(f"unknown device {v!r} (auto, cpu, cuda, none, CUDA0)")


# llama-server flags that tritium accepts without a change in what it computes (memory mapping,
# NUMA, batch threads, multi-GPU splits, web UI, logging cosmetics, ...): (names, takes a value)
_NO_EFFECT = [
    (("-tb", "--threads-batch"), True), (("-fa", "--flash-attn"), True), (("-cb", "--cont-batching"), False),
    (("-nocb", "--no-cont-batching"), False), (("--mlock",), False), (("--mmap",), False),
    (("--no-mmap",), False), (("--numa",), True), (("-sm", "--split-mode"), True), (("-mg", "--main-gpu"), True),
    (("-ts", "--tensor-split"), True), (("-fit", "--fit"), True), (("-dt", "--defrag-thold"), True),
    (("--threads-http",), True), (("--keep",), True), (("--context-shift",), False),
    (("--no-context-shift",), False), (("--swa-full",), False), (("--ctx-checkpoints", "--swa-checkpoints"), True),
    (("--spm-infill",), False),
    (("--no-prefill-assistant",), False), (("-lcs", "--lookup-cache-static"), True),
    (("-lcd", "--lookup-cache-dynamic"), True), (("--reuse-port",), False), (("-e", "--escape"), False),
    (("--no-escape",), False), (("--log-colors",), True), (("--log-prefix",), False), (("--log-timestamps",), False),
    (("--no-perf",), False), (("--perf",), False), (("-kvo", "--kv-offload"), False),
    (("-nkvo", "--no-kv-offload"), False), (("--repack",), False), (("-nr", "--no-repack"), False),
    (("--no-host",), False), (("-sp", "--special"), False), (("--poll",), True), (("--poll-batch",), True),
    (("--cpu-strict",), True), (("--cpu-strict-batch",), True), (("-Cb", "--cpu-mask-batch"), True),
    (("-Crb", "--cpu-range-batch"), True), (("--prio-batch",), True), (("-ub", "--ubatch-size"), True),
    (("-bs", "--backend-sampling"), False),  # samples on the device: the same distributions
]
# accepted with a warning: the output is the same, only the speed differs (no speculative decoding)
_SPECULATIVE = [
    (("-md", "--model-draft"), True), (("--draft", "--draft-n", "--draft-max"), True), (("--draft-min",), True),
    (("--draft-p-min",), True), (("-cd", "--ctx-size-draft"), True), (("-devd", "--device-draft"), True),
    (("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), True), (("--spec-replace",), True),
]
# refused: they would change what the server computes or serves, and tritium does not implement them
_UNSUPPORTED = [
    (("--control-vector",), True), (("--control-vector-scaled",), True), (("-mu", "--model-url"), True), (("--rerank", "--reranking"), False),
    (("--api-prefix",), True), (("--mirostat",), True),
    (("-l", "--logit-bias"), True), (("--path",), True), (("--ssl-key-file",), True), (("--ssl-cert-file",), True),
]


def _add_llama_server_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("llama-server compatibility")
    g.add_argument("-b", "--batch-size", type=int, default=2048, metavar="N",
                   help="logical maximum batch size: prompt tokens evaluated per step")
    g.add_argument("-C", "--cpu-mask", default=None, metavar="M",
                   help="CPU affinity mask, hex (e.g. ff): the process and every thread it starts are pinned to it")
    g.add_argument("-Cr", "--cpu-range", default=None, metavar="LO-HI", help="CPU affinity range (e.g. 0-3)")
    g.add_argument("--prio", type=int, default=0, metavar="N",
                   help="process priority: -1 low, 0 normal, 1 medium, 2 high, 3 realtime (nice values)")
    g.add_argument("--no-warmup", dest="warmup", action="store_false", default=True,
                   help="skip the warm-up forward at load")
    g.add_argument("--warmup", dest="warmup", action="store_true")
    g.add_argument("-ctk", "--cache-type-k", default="f16", metavar="TYPE", help="KV cache type (f32, f16, bf16)")
    g.add_argument("-ctv", "--cache-type-v", default="f16", metavar="TYPE", help="KV cache type (f32, f16, bf16)")
    g.add_argument("--rope-scaling", choices=("none", "linear", "yarn"), default=None,
                   help="RoPE frequency scaling (default: the model's)")
    g.add_argument("--rope-scale", type=float, default=None, metavar="N", help="RoPE context scaling factor")
    g.add_argument("--rope-freq-base", type=float, default=None, metavar="N", help="RoPE base frequency")
    g.add_argument("--rope-freq-scale", type=float, default=None, metavar="N",
                   help="RoPE frequency scaling factor (1 / --rope-scale)")
    g.add_argument("--yarn-orig-ctx", type=int, default=None, metavar="N", help="YaRN original context size")
    g.add_argument("--yarn-ext-factor", type=float, default=None, metavar="N")
    g.add_argument("--yarn-attn-factor", type=float, default=None, metavar="N")
    g.add_argument("--yarn-beta-slow", type=float, default=None, metavar="N")
    g.add_argument("--yarn-beta-fast", type=float, default=None, metavar="N")
    g.add_argument("--log-disable", action="store_true", help="no log output")
    g.add_argument("--log-file", default=None, metavar="FNAME", help="also write the log to this file")
    for prefix, table in (("_noeffect_", _NO_EFFECT), ("_spec_", _SPECULATIVE), ("_unsupported_", _UNSUPPORTED)):
        for names, value in table:
            kw = {} if value else {"action": "store_const", "const": True}
            g.add_argument(*names, dest=_dest(prefix, names), default=None, help=argparse.SUPPRESS, **kw)


def _dest(prefix: str, names: tuple[str, ...]) -> str:
    return prefix + names[-1].lstrip("-").replace("-", "_")


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
            text = json_schema_to_gbnf(json.loads(text))
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


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig of parsed arguments; raises ArgError like llama-server."""
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
    d = SamplingParams()
    defaults = SamplingParams(
        temperature=f32(args.temp), top_k=args.top_k, top_p=f32(args.top_p), min_p=f32(args.min_p),
        typical_p=f32(args.typical), seed=args.seed & 0xFFFFFFFF, repeat_penalty=f32(args.repeat_penalty),
        repeat_last_n=args.repeat_last_n, presence_penalty=f32(args.presence_penalty),
        frequency_penalty=f32(args.frequency_penalty),
        dynatemp_range=f32(args.dynatemp_range), dynatemp_exponent=f32(args.dynatemp_exp),
        xtc_probability=f32(args.xtc_probability), xtc_threshold=f32(args.xtc_threshold),
        top_n_sigma=f32(args.top_nsigma), min_keep=args.min_keep, ignore_eos=args.ignore_eos,
        dry_multiplier=f32(args.dry_multiplier), dry_base=f32(args.dry_base),
        dry_allowed_length=args.dry_allowed_length, dry_penalty_last_n=args.dry_penalty_last_n,
        samplers=[s for s in args.samplers.split(";") if s] if args.samplers else list(d.samplers),
        grammar=grammar)
    return ServerConfig(
        model_path=args.model or "", port=args.port, api_keys=_api_keys(args), **cli_net.net_settings(args),
        max_body_size=args.max_body_size, read_timeout=float(args.timeout), shutdown_timeout=args.shutdown_timeout,
        metrics=args.metrics, slots=args.slots, props=args.props, slot_save_path=args.slot_save_path,
        sse_ping_interval=args.sse_ping_interval, embeddings=args.embeddings, pooling=args.pooling,
        embd_normalize=args.embd_normalize, jinja=args.jinja, reasoning_format=args.reasoning_format,
        reasoning_budget=args.reasoning_budget, enable_thinking={"on": True, "off": False}.get(args.reasoning or ""),
        n_predict=args.n_predict, defaults=defaults, ui=args.ui)


def engine_config(args: argparse.Namespace, scfg: ServerConfig):
    """The EngineConfig of parsed arguments (imports the engine, hence torch)."""
    from runtime.serving import EngineConfig

    device = args.device  # "auto" is resolved by the engine
    return EngineConfig(
        model_path=args.model, n_ctx=args.ctx_size, n_parallel=args.parallel,
        kv_unified=True if args.kv_unified else None, n_threads=args.threads, device=device,
        cache_ram_mib=args.cache_ram, cache_reuse=args.cache_reuse, cache_idle_slots=args.cache_idle_slots,
        sleep_idle_seconds=args.sleep_idle_seconds,
        slot_prompt_similarity=args.slot_prompt_similarity, slot_save_path=args.slot_save_path,
        embeddings=args.embeddings, pooling=args.pooling, n_predict=args.n_predict, defaults=scfg.defaults,
        chat_template=args.chat_template, chat_template_file=args.chat_template_file,
        verbosity=verbosity(args), n_batch=max(1, args.batch_size), kv_dtype=_kv_dtype(args), warmup=args.warmup,
        config_overrides=_rope_overrides(args), lora=lora_adapters(args),
        lora_init_without_apply=args.lora_init_without_apply)


def _sleep_seconds(v: str) -> int:
    n = int(v)
    if n == 0 or n < -1:
        raise argparse.ArgumentTypeError("invalid value: cannot be 0 or less than -1")
    return n


def verbosity(args: argparse.Namespace) -> int:
    if args.log_disable:
        return -1
    return 4 if args.verbose else args.verbosity


def _pin_and_prioritise(args: argparse.Namespace, log: Logger) -> None:
    """-C/-Cr: pin the process (threads started later, torch's and the kernels' OpenMP pools
    included, inherit it); --prio: its nice value."""
    cpus = _cpu_set(args)
    if cpus is not None:
        try:
            os.sched_setaffinity(0, cpus)
            log.srv("I", "llama_server", f"pinned to CPUs {','.join(map(str, sorted(cpus)))}")
        except (OSError, AttributeError, ValueError) as e:
            log.srv("W", "llama_server", f"could not set the CPU affinity: {e}")
    if args.prio:
        nice = {-1: 10, 1: -5, 2: -10, 3: -20}.get(args.prio, 0)
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except (OSError, AttributeError) as e:
            log.srv("W", "llama_server", f"could not set the process priority {args.prio}: {e}")
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


def _start_ranks(n: int, argv: list[str], log: Logger) -> None:
    """`-tp N` without torchrun: this process becomes rank 0 and starts ranks 1..N-1; when one of
    them ends, the server ends with an error (a tensor-parallel model cannot run without a rank)."""
    from runtime.parallel.worker import spawn

    procs: list = []

    def on_exit(rank: int, code: int) -> None:
        log.srv("E", "llama_server", f"tensor parallel rank {rank} exited with status {code}: shutting down")
        for p in procs:
            if p.poll() is None:
                p.kill()
        os._exit(1)
    procs.extend(spawn(n, argv, on_exit))


def _worker(args: argparse.Namespace, scfg: ServerConfig, log: Logger) -> int:
    """Ranks 1..N-1: no HTTP server, only the model's shard (runtime.parallel.worker)."""
    from runtime.serving.bootstrap import serve_worker

    if os.environ.get("TRITIUM_TP_SPAWNED"):
        from runtime.parallel.worker import watch_parent
        watch_parent()
    ecfg = engine_config(args, scfg)
    ecfg.log = log.raw
    serve_worker(ecfg, lambda level, msg: log.raw(level, msg))
    return 0


def _fetch_hf_model(args: argparse.Namespace, scfg: ServerConfig, log: Logger) -> bool:
    """-hf: the model file from the Hub (or its cache) becomes -m; the repo is the model's name."""
    from runtime.hf_download import HfDownloadError, HfModelRequest, download_model

    req = HfModelRequest(args.hf_repo, file=args.hf_file, token=args.hf_token or os.environ.get("HF_TOKEN"),
                         offline=args.offline)
    try:
        path = download_model(req, log=lambda m: log.srv("W", "llama_server", m))
    except HfDownloadError as e:
        log.srv("E", "llama_server", f"failed to fetch model metadata: {e}")
        return False
    args.model = scfg.model_path = str(path)
    scfg.alias = scfg.alias or args.hf_repo
    log.srv("I", "llama_server", f"model from {args.hf_repo}: {path}")
    return True


def main(argv: list[str] | None = None) -> int:
    # as llama-server: "--backend_sampling" is "--backend-sampling"
    argv = [a.replace("_", "-") if a.startswith("--") else a for a in (sys.argv[1:] if argv is None else argv)]
    args = build_parser().parse_args(argv)
    try:
        scfg = server_config(args)
        n_ranks = tp_size(args)
    except ArgError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
    log = Logger(verbosity(args), log_file=args.log_file)
    _pin_and_prioritise(args, log)
    if args.hf_repo and not _fetch_hf_model(args, scfg, log):
        return 1
    if n_ranks > 1 and int(os.environ.get("RANK", "0")) > 0:
        return _worker(args, scfg, log)
    if n_ranks > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        _start_ranks(n_ranks, list(sys.argv[1:] if argv is None else argv), log)
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

    uv = DrainingServer(uvicorn.Config(app, log_level="warning", access_log=False, server_header=False, timeout_keep_alive=args.timeout,
                                       lifespan="off", http=header_timeout_protocol(args.header_timeout),
                                       timeout_graceful_shutdown=5),
                        app.state.drain, args.shutdown_timeout, lambda m: log.srv("I", "llama_server", m))
    failed: list[BaseException] = []

    def load() -> None:
        try:
            from runtime.serving import Engine

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
            for host in scfg.hosts:
                log.srv("I", "llama_server", f"listening on http://{f'[{host}]' if ':' in host else host}:{port}")
            if port == 8080:
                log.srv("W", "llama_server", "notice: server default port will be changed to :9931 in a future "
                                             "release (ref: https://github.com/ggml-org/llama.cpp/pull/26508)")
        except BaseException as e:  # noqa: BLE001 - reported, then the server exits
            failed.append(e)
            log.srv("E", "llama_server", f"exiting due to model loading error: {e}")
            uv.should_exit = True

    threading.Thread(target=load, name="tritium-load", daemon=True).start()
    try:
        uv.run(sockets=socks)
    finally:
        if server.engine is not None:
            server.engine.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

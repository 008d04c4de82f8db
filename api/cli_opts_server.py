"""llama-server's options of common/arg.cpp (b1-0c1e570), third part: the server's own (listening,
CORS, the web UI, agents, endpoints, API keys, TLS, timeouts, caching, the router, chat templates
and reasoning, slots) and the log options (arg.cpp lines 3285-3975, in their order).
"""
from __future__ import annotations

import argparse
import os
import sys

from api.cli_spec import (Effect, Invalid, Kind, Section, checked, const, is_autoy, is_falsey, is_truthy, nothing,
                          log_warn, opt, parse_csv_row, stof, store, string_strip)

N, P, SV = Effect.NO_EFFECT, Effect.PENDING, Section.SERVER
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")

DEFAULTS = dict(
    embd_normalize=2, host="127.0.0.1", port=8080, reuse_port=False, public_path="", cors_origins=None,
    cors_methods="GET, POST, DELETE, OPTIONS", cors_headers="*", cors_credentials=True, api_prefix="",
    ui_config=None, ui_mcp_proxy=False, tools=None, tools_runtime=None, mcp_servers_config=None,
    mcp_servers_json=None, agent=False, ui=True, embeddings=False, reranking=False, api_keys=[], ssl_key_file=None,
    ssl_cert_file=None, template_kwargs={}, preserve_reasoning_specified=False, timeout=3600,
    sse_ping_interval=30, cache_prompt=True, cache_reuse=0, metrics=False, props=False, slots=True,
    slot_save_path=None, media_path=None, models_dir=None, models_preset=None, models_max=4, models_autoload=True,
    jinja=True, reasoning_format="auto", reasoning=None, reasoning_budget=-1, reasoning_budget_message="",
    chat_template=None, chat_template_file=None, skip_chat_parsing=False, prefill_assistant=True,
    slot_prompt_similarity=0.10, lora_init_without_apply=False, sleep_idle_seconds=-1, log_disable=False,
    log_file=None, verbose=False, offline=False, verbosity=3,
)


def _hosts(ns: argparse.Namespace, v: str) -> None:
    hosts = [string_strip(h) for h in parse_csv_row(v)]
    hosts = [h for h in hosts if h]
    if not hosts:
        raise Invalid("--host requires at least one address")
    ns.host = ",".join(hosts)


def _cors_origins(ns: argparse.Namespace, v: str) -> None:
    ns.cors_origins = v


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        raise Invalid(f"error: failed to open file '{path}'\n") from None


def _agent(ns: argparse.Namespace, on: bool) -> None:
    ns.agent = on
    ns.tools = "all" if on else None
    ns.ui_mcp_proxy = on


def _rerank(ns: argparse.Namespace) -> None:
    ns.embeddings = True  # b1: embeddings with RANK pooling
    ns.reranking = True
    ns.pooling = "rank"


def _api_key(ns: argparse.Namespace, v: str) -> None:
    ns.api_keys = ns.api_keys + [k for k in parse_csv_row(v) if k]


def _api_key_file(ns: argparse.Namespace, v: str) -> None:
    """One key a line; empty lines and lines starting with '#' are skipped (nothing is stripped)."""
    try:
        with open(v, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        raise Invalid(f"error: failed to open file '{v}'\n") from None
    if lines and lines[-1] == b"":
        lines.pop()
    ns.api_keys = ns.api_keys + [k.decode("utf-8", "surrogateescape") for k in lines if k and not k.startswith(b"#")]


def json_value(text: str):
    """nlohmann's json::parse of a flag's value (its error texts)."""
    from api.errors import ApiError
    from api.strict_json import loads

    try:
        return loads(text.encode("utf-8", "surrogateescape"))
    except ApiError as e:
        raise Invalid(e.message) from None


def json_dump(value) -> str:
    """nlohmann's dump(): compact, non-ASCII kept."""
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _template_kwargs(ns: argparse.Namespace, v: str) -> None:
    """Default chat_template_kwargs: each key's value kept as JSON text (request kwargs override them)."""
    parsed = json_value(v)
    items = (parsed.items() if isinstance(parsed, dict) else
             ((str(i), x) for i, x in enumerate(parsed)) if isinstance(parsed, list) else (("", parsed),))
    kw = dict(ns.template_kwargs)
    for key, value in items:
        if key == "enable_thinking":
            log_warn("Setting 'enable_thinking' via --chat-template-kwargs is deprecated. "
                 "Use --reasoning on / --reasoning off instead.\n")
        if key == "preserve_reasoning":
            log_warn("Setting 'preserve_reasoning' via --chat-template-kwargs is deprecated. "
                 "Use --reasoning-preserve / --no-reasoning-preserve instead.\n")
        kw[key] = json_dump(value)
    ns.template_kwargs = kw


def _dir(dest: str):
    """--slot-save-path / --media-path: an existing directory, with a trailing separator."""
    def h(ns: argparse.Namespace, v: str) -> None:
        if not os.path.isdir(v):
            raise Invalid("not a directory: " + v)
        setattr(ns, dest, v if v.endswith(os.sep) else v + os.sep)
    return h


def _reasoning_format(v: str) -> str:
    if v not in REASONING_FORMATS:
        raise Invalid("Unknown reasoning format: " + v)
    return v


def _reasoning(ns: argparse.Namespace, v: str) -> None:
    kw = dict(ns.template_kwargs)
    if is_truthy(v):
        ns.reasoning, kw["enable_thinking"] = "on", "true"
    elif is_falsey(v):
        ns.reasoning, kw["enable_thinking"] = "off", "false"
    elif is_autoy(v):
        ns.reasoning = "auto"
    else:
        raise Invalid(f"error: unknown value for --reasoning: '{v}'\n")
    ns.template_kwargs = kw


def _reasoning_effort(ns: argparse.Namespace, v: str) -> None:
    kw = dict(ns.template_kwargs)
    if v == "default":
        kw.pop("reasoning_effort", None)
    else:
        kw["reasoning_effort"] = json_dump(v)
    ns.template_kwargs = kw


def _reasoning_budget(v: int) -> int:
    if v < -1:
        raise Invalid("invalid value")
    return v


def _reasoning_preserve(ns: argparse.Namespace, on: bool) -> None:
    ns.template_kwargs = dict(ns.template_kwargs, preserve_reasoning="true" if on else "false")
    ns.preserve_reasoning_specified = True


def _chat_template_file(ns: argparse.Namespace, v: str) -> None:
    ns.chat_template = _read_file(v)
    ns.chat_template_file = v


def _sleep_seconds(v: int) -> int:
    if v == 0 or v < -1:
        raise Invalid("invalid value: cannot be 0 or less than -1")
    return v


def _log_file(ns: argparse.Namespace, v: str) -> None:
    ns.log_file = v


def _log_prompts_dir(ns: argparse.Namespace, v: str) -> None:
    try:
        os.makedirs(v, exist_ok=True)
    except OSError as e:
        sys.stderr.write(f"warning: failed to create prompts-log-dir '{v}': {e.strerror}\n")


def _verbose(ns: argparse.Namespace) -> None:
    ns.verbose = True


def _log_colors(v: str) -> None:
    if not (is_truthy(v) or is_falsey(v) or is_autoy(v)):
        raise Invalid(f"error: unknown value for --log-colors: '{v}'\n")


AGENT = "built-in tools and MCP servers are not served by tritium (the flag narrows CORS as in llama-server)"
LOG_LOOK = "how log lines look, not what is computed"
OPTIONS = [
    opt(("--embd-normalize",), "N", store("embd_normalize"), kind=Kind.INT, section=SV),
    opt(("--host",), "HOST", _hosts, env="LLAMA_ARG_HOST", section=SV),
    opt(("--port",), "PORT", store("port"), kind=Kind.INT, env="LLAMA_ARG_PORT", section=SV),
    opt(("--reuse-port",), None, const("reuse_port"), env="LLAMA_ARG_REUSE_PORT", section=SV),
    opt(("--path",), "PATH", store("public_path"), env="LLAMA_ARG_STATIC_PATH", section=SV),
    opt(("--cors-origins",), "ORIGINS", _cors_origins, env="LLAMA_ARG_CORS_ORIGINS", section=SV),
    opt(("--cors-methods",), "METHODS", store("cors_methods"), env="LLAMA_ARG_CORS_METHODS", section=SV),
    opt(("--cors-headers",), "HEADERS", store("cors_headers"), env="LLAMA_ARG_CORS_HEADERS", section=SV),
    opt(("--cors-credentials",), None, store("cors_credentials"), neg=("--no-cors-credentials",),
        env="LLAMA_ARG_CORS_CREDENTIALS", section=SV),
    opt(("--api-prefix",), "PREFIX", store("api_prefix"), env="LLAMA_ARG_API_PREFIX", section=SV),
    opt(("--ui-config", "--webui-config"), "JSON", store("ui_config"), env="LLAMA_ARG_UI_CONFIG", section=SV),
    opt(("--ui-config-file", "--webui-config-file"), "PATH", lambda ns, v: setattr(ns, "ui_config", _read_file(v)),
        env="LLAMA_ARG_UI_CONFIG_FILE", section=SV),
    opt(("--ui-mcp-proxy", "--webui-mcp-proxy"), None, store("ui_mcp_proxy"),
        neg=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), env="LLAMA_ARG_UI_MCP_PROXY", section=SV),
    opt(("--tools",), "TOOL1,TOOL2,...", lambda ns, v: setattr(ns, "tools", ",".join(parse_csv_row(v))),
        env="LLAMA_ARG_TOOLS", section=SV, effect=N, note=AGENT),
    opt(("--tools-runtime",), "OPTION", store("tools_runtime"), env="LLAMA_ARG_TOOLS_RUNTIME", section=SV, effect=N,
        note=AGENT),
    opt(("--mcp-servers-config",), "PATH", store("mcp_servers_config"), env="LLAMA_ARG_MCP_SERVERS_CONFIG",
        section=SV, effect=N, note=AGENT),
    opt(("--mcp-servers-json",), "JSON", store("mcp_servers_json"), env="LLAMA_ARG_MCP_SERVERS_JSON", section=SV,
        effect=N, note=AGENT),
    opt(("-ag", "--agent"), None, _agent, neg=("-no-ag", "--no-agent"), env="LLAMA_ARG_AGENT", section=SV),
    opt(("--ui", "--webui"), None, store("ui"), neg=("--no-ui", "--no-webui"), env="LLAMA_ARG_UI", section=SV),
    opt(("--embedding", "--embeddings"), None, const("embeddings"), env="LLAMA_ARG_EMBEDDINGS", section=SV),
    opt(("--rerank", "--reranking"), None, _rerank, env="LLAMA_ARG_RERANKING", section=SV),
    opt(("--api-key",), "KEY", _api_key, env="LLAMA_API_KEY", section=SV),
    opt(("--api-key-file",), "FNAME", _api_key_file, env="LLAMA_ARG_API_KEY_FILE", section=SV),
    opt(("--ssl-key-file",), "FNAME", store("ssl_key_file"), env="LLAMA_ARG_SSL_KEY_FILE", section=SV),
    opt(("--ssl-cert-file",), "FNAME", store("ssl_cert_file"), env="LLAMA_ARG_SSL_CERT_FILE", section=SV),
    opt(("--chat-template-kwargs",), "STRING", _template_kwargs, env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", section=SV),
    opt(("-to", "--timeout"), "N", store("timeout"), kind=Kind.INT, env="LLAMA_ARG_TIMEOUT", section=SV),
    opt(("--sse-ping-interval",), "N", store("sse_ping_interval"), kind=Kind.INT, env="LLAMA_ARG_SSE_PING_INTERVAL",
        section=SV),
    opt(("--threads-http",), "N", nothing, kind=Kind.INT, env="LLAMA_ARG_THREADS_HTTP", section=SV, effect=N,
        note="tritium serves HTTP from one event loop (heavy work in worker threads): speed only"),
    opt(("--cache-prompt",), None, store("cache_prompt"), neg=("--no-cache-prompt",), env="LLAMA_ARG_CACHE_PROMPT",
        section=SV),
    opt(("--cache-reuse",), "N", store("cache_reuse"), kind=Kind.INT, env="LLAMA_ARG_CACHE_REUSE", section=SV),
    opt(("--metrics",), None, const("metrics"), env="LLAMA_ARG_ENDPOINT_METRICS", section=SV),
    opt(("--props",), None, const("props"), env="LLAMA_ARG_ENDPOINT_PROPS", section=SV),
    opt(("--slots",), None, store("slots"), neg=("--no-slots",), env="LLAMA_ARG_ENDPOINT_SLOTS", section=SV),
    opt(("--slot-save-path",), "PATH", _dir("slot_save_path"), section=SV),
    opt(("--media-path",), "PATH", _dir("media_path"), section=SV),
    opt(("--models-dir",), "PATH", store("models_dir"), env="LLAMA_ARG_MODELS_DIR", section=SV),
    opt(("--models-preset",), "PATH", store("models_preset"), env="LLAMA_ARG_MODELS_PRESET", section=SV),
    opt(("--models-max",), "N", store("models_max"), kind=Kind.INT, env="LLAMA_ARG_MODELS_MAX", section=SV),
    opt(("--models-autoload",), None, store("models_autoload"), neg=("--no-models-autoload",),
        env="LLAMA_ARG_MODELS_AUTOLOAD", section=SV),
    opt(("--jinja",), None, store("jinja"), neg=("--no-jinja",), env="LLAMA_ARG_JINJA", section=SV),
    opt(("--reasoning-format",), "FORMAT", store("reasoning_format", _reasoning_format), env="LLAMA_ARG_THINK",
        section=SV),
    opt(("-rea", "--reasoning"), "[on|off|auto]", _reasoning, env="LLAMA_ARG_REASONING", section=SV),
    opt(("--reasoning-effort",), "LEVEL", _reasoning_effort, env="LLAMA_ARG_REASONING_EFFORT", section=SV),
    opt(("--reasoning-budget",), "N", checked(_reasoning_budget, "reasoning_budget"), kind=Kind.INT,
        env="LLAMA_ARG_THINK_BUDGET", section=SV),
    opt(("--reasoning-budget-message",), "MESSAGE", store("reasoning_budget_message"),
        env="LLAMA_ARG_THINK_BUDGET_MESSAGE", section=SV),
    opt(("--reasoning-preserve",), None, _reasoning_preserve, neg=("--no-reasoning-preserve",),
        env="LLAMA_ARG_REASONING_PRESERVE", section=SV),
    opt(("--chat-template",), "JINJA_TEMPLATE", lambda ns, v: (setattr(ns, "chat_template", v),
                                                             setattr(ns, "chat_template_file", None)) and None,
        env="LLAMA_ARG_CHAT_TEMPLATE", section=SV),
    opt(("--chat-template-file",), "JINJA_TEMPLATE_FILE", _chat_template_file, env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
        section=SV),
    opt(("--skip-chat-parsing",), None, store("skip_chat_parsing"), neg=("--no-skip-chat-parsing",),
        env="LLAMA_ARG_SKIP_CHAT_PARSING", section=SV),
    opt(("--prefill-assistant",), None, store("prefill_assistant"), neg=("--no-prefill-assistant",),
        env="LLAMA_ARG_PREFILL_ASSISTANT", section=SV),
    opt(("-sps", "--slot-prompt-similarity"), "SIMILARITY", store("slot_prompt_similarity", stof),
        section=SV),
    opt(("--lora-init-without-apply",), None, const("lora_init_without_apply"), section=SV),
    opt(("--sleep-idle-seconds",), "SECONDS", checked(_sleep_seconds, "sleep_idle_seconds"), kind=Kind.INT,
        section=SV),
    opt(("--log-disable",), None, const("log_disable")),
    opt(("--log-file",), "FNAME", _log_file, env="LLAMA_ARG_LOG_FILE"),
    opt(("--log-jsonl",), None, nothing, neg=("--no-log-jsonl",), env="LLAMA_ARG_LOG_JSONL", effect=N, note=LOG_LOOK),
    opt(("--log-prompts-dir",), "PATH", _log_prompts_dir, section=SV, effect=N,
        note="a debugging aid: the directory is made, no prompts are written to it"),
    opt(("--log-colors",), "[on|off|auto]", checked(_log_colors), env="LLAMA_ARG_LOG_COLORS", effect=N,
        note=LOG_LOOK),
    opt(("-v", "--verbose", "--log-verbose"), None, _verbose),
    opt(("--offline",), None, const("offline"), env="LLAMA_ARG_OFFLINE"),
    opt(("-lv", "--verbosity", "--log-verbosity"), "N", store("verbosity"), kind=Kind.INT,
        env="LLAMA_ARG_LOG_VERBOSITY"),
    opt(("--log-prefix",), None, nothing, neg=("--no-log-prefix",), env="LLAMA_ARG_LOG_PREFIX", effect=N,
        note=LOG_LOOK),
    opt(("--log-timestamps",), None, nothing, neg=("--no-log-timestamps",), env="LLAMA_ARG_LOG_TIMESTAMPS",
        effect=N, note=LOG_LOOK),
]

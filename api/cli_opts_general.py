"""llama-server's options of common/arg.cpp (b1-0c1e570), first part: program, threads and CPUs,
context and batches, and the sampling defaults (arg.cpp lines 1443-2305, in their order).

Each is an `api.cli_spec.Opt`; its handler does what arg.cpp's lambda does to `common_params`,
here to the namespace whose fields `DEFAULTS` lists (api/cli.py builds the configs from it).
"""
from __future__ import annotations

import argparse
import os

from api.cli_spec import (Effect, Exit, Invalid, Kind, Section, checked, const, is_autoy, is_falsey, is_truthy,
                          log_err, log_warn, nothing, opt, stof, stoul, stoull, store, string_split)
from runtime.tasks import SamplingParams

N, S = Effect.NO_EFFECT, Section.SAMPLING
_D = SamplingParams()
MAX_THREADS = 512  # GGML_MAX_N_THREADS: CPU masks and ranges address this many CPUs

DEFAULTS = dict(
    usage=False, completion=False, threads=-1, cpu_set=set(), prio=0, ctx_size=4096, kv_unified_per_slot=0,
    n_predict=-1, batch_size=2048, ubatch_size=512, n_keep=0, swa_full=False, ctx_checkpoints=32, cache_ram=8192,
    kv_unified=None, cache_idle_slots=True, ctx_shift=False, flash_attn="auto", escape=True, antiprompt=[], special=False,
    warmup=True, spm_infill=False, samplers=list(_D.samplers), seed=-1, ignore_eos=False, temp=_D.temperature,
    top_k=_D.top_k, top_p=_D.top_p, min_p=_D.min_p, top_nsigma=_D.top_n_sigma, xtc_probability=_D.xtc_probability,
    xtc_threshold=_D.xtc_threshold, typical=_D.typical_p, repeat_last_n=_D.repeat_last_n,
    repeat_penalty=_D.repeat_penalty, presence_penalty=_D.presence_penalty, frequency_penalty=_D.frequency_penalty,
    dry_multiplier=_D.dry_multiplier, dry_base=_D.dry_base, dry_allowed_length=_D.dry_allowed_length,
    dry_penalty_last_n=_D.dry_penalty_last_n, dry_sequence_breakers=list(_D.dry_sequence_breakers),
    adaptive_target=_D.adaptive_target, adaptive_decay=_D.adaptive_decay, dynatemp_range=_D.dynatemp_range,
    dynatemp_exp=_D.dynatemp_exponent, mirostat=_D.mirostat, mirostat_lr=_D.mirostat_eta,
    mirostat_ent=_D.mirostat_tau, logit_bias=[], grammar_source=None, min_keep=_D.min_keep,
    lookup_cache_static="", lookup_cache_dynamic="",
)

# ---- helpers of the handlers below -----------------------------------------------------------

SAMPLER_CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill",
                     "penalties", "adaptive_p")
SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                 "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}


def _sampler_aliases() -> dict[str, str]:
    names = {c: c for c in SAMPLER_CANONICAL}
    for c in SAMPLER_CANONICAL:
        if "_" in c:
            names[c.replace("_", "-")] = c
            names[c.replace("_", "")] = c
    names.update(nucleus="top_p", temp="temperature", typ="typ_p")
    return names


_SAMPLER_NAMES = _sampler_aliases()


def samplers_from_names(value: str) -> list[str]:
    """common_sampler_types_from_names over `value` split at ';' (unknown names warn and are skipped)."""
    out = []
    for name in string_split(value, ";"):
        low = name.lower()
        if low in _SAMPLER_NAMES:
            out.append(_SAMPLER_NAMES[low])
        else:
            log_warn(f"common_sampler_types_from_names: unable to match sampler by name '{low}'\n")
    return out


def samplers_from_chars(value: str) -> list[str]:
    out = []
    for c in value:
        if c in SAMPLER_CHARS:
            out.append(SAMPLER_CHARS[c])
        else:
            log_warn(f"common_sampler_types_from_chars: unable to match sampler by char '{c}'\n")
    return out


def cpu_mask(value: str) -> set[int]:
    """parse_cpu_mask: hex digits (an optional 0x), the last digit CPUs 0-3; at most 128 digits."""
    start = 2 if value.startswith("0x") else 0
    digits = value[start:start + 128]
    for i, c in enumerate(digits):
        if c not in "0123456789abcdefABCDEF":
            log_err("parse_cpu_mask", f"Invalid hex character '{c}' at position {start + i}\n")
            raise Invalid("invalid cpumask")
    bits = int(digits, 16) if digits else 0
    return {i for i in range(bits.bit_length()) if bits >> i & 1}


def cpu_range(value: str, error: str = "invalid range") -> set[int]:
    """parse_cpu_range: [lo]-[hi], both within MAX_THREADS."""
    dash = value.find("-")
    if dash < 0:
        log_err("parse_cpu_range", "Format of CPU range is invalid! Expected [<start>]-[<end>].\n")
        raise Invalid(error)
    lo = 0 if dash == 0 else stoull(value[:dash])
    if lo >= MAX_THREADS:
        log_err("parse_cpu_range", "Start index out of bounds!\n")
        raise Invalid(error)
    hi = MAX_THREADS - 1 if dash == len(value) - 1 else stoull(value[dash + 1:])
    if hi >= MAX_THREADS:
        log_err("parse_cpu_range", "End index out of bounds!\n")
        raise Invalid(error)
    return set(range(lo, hi + 1))


def _add_cpus(parse, dest: str = "cpu_set"):
    def h(ns: argparse.Namespace, value: str) -> None:
        setattr(ns, dest, getattr(ns, dest) | parse(value))
    return h


def _prio(lo: int):
    def check(v: int) -> int:
        if v < lo or v > 3:
            raise Invalid("invalid value")
        return v
    return check


def _threads(ns: argparse.Namespace, v: int) -> None:
    ns.threads = v if v > 0 else (os.cpu_count() or 1)


def _on_off_auto(flag: str, error_type: str = "unknown value"):
    def check(v: str) -> str:
        if is_truthy(v) or is_falsey(v) or is_autoy(v):
            return v
        raise Invalid(f"error: {error_type} for {flag}: '{v}'\n")
    return check


def _min(flag: str, lo: int):
    def check(v: int) -> int:
        if v < lo:
            raise Invalid(f"error: invalid {flag} = {v}\n")
        return v
    return check


def _non_negative_step(v: int) -> None:
    if v < 0:
        raise Invalid("checkpoint-min-step must be non-negative")


def _repeat_penalty(v: str) -> float:
    p = stof(v)
    if not (abs(p) < float("inf")) or p <= 0.0 or not (abs(1.0 / p) < float("inf") if p else False):
        raise Invalid("error: repeat-penalty must be finite and greater than 0\n")
    return p


def _finite(flag: str):
    def check(v: str) -> float:
        p = stof(v)
        if not (abs(p) < float("inf")):
            raise Invalid(f"error: {flag} must be finite\n")
        return p
    return check


def _dry_base(ns: argparse.Namespace, v: str) -> None:
    b = stof(v)
    if b >= 1.0:
        ns.dry_base = b


def _dry_breaker(ns: argparse.Namespace, v: str) -> None:
    if not getattr(ns, "_dry_cleared", False):  # the first use clears the defaults
        ns.dry_sequence_breakers = []
        ns._dry_cleared = True
    if v == "none":
        ns.dry_sequence_breakers = []
    else:
        ns.dry_sequence_breakers = ns.dry_sequence_breakers + [v]


def _logit_bias(ns: argparse.Namespace, v: str) -> None:
    """`ss >> key >> sign; getline(ss, rest); stof(rest)`: an id, a sign, a float prefix."""
    import re

    m = re.fullmatch(r"[ \t\n\v\f\r]*([+-]?\d+)[ \t\n\v\f\r]*([^ \t\n\v\f\r])(.*)", v, re.S)
    if m is None or m.group(2) not in "+-":
        raise Invalid("invalid input format")
    key = int(m.group(1))
    if not -(1 << 31) <= key < (1 << 31):
        raise Invalid("invalid input format")
    try:
        bias = stof(m.group(3))
    except Invalid:
        raise Invalid("invalid input format") from None
    ns.logit_bias = ns.logit_bias + [(key, bias * (-1.0 if m.group(2) == "-" else 1.0))]


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        raise Invalid(f"error: failed to open file '{path}'\n") from None


def _grammar(flag: str, kind: str, read: bool = False):
    """--grammar / --grammar-file / -j / -jf: the last one given is the default grammar, as GBNF
    (its syntax is checked at start-up: api/cli.py)."""
    def h(ns: argparse.Namespace, v: str) -> None:
        text = _read_file(v) if read else v
        if kind == "json":
            text = json_schema_grammar(text)
        ns.grammar_source = (flag, text)
    return h


def json_schema_grammar(text: str) -> str:
    """json_schema_to_grammar(json::parse(text)): GBNF, or Invalid with llama.cpp's text."""
    from api.cli_opts_server import json_value
    from grammar import GrammarError, json_schema_to_gbnf

    schema = json_value(text)
    try:
        return json_schema_to_gbnf(schema)
    except (GrammarError, ValueError, TypeError) as e:
        raise Invalid(f"JSON schema conversion failed:\n{e}") from None


def _json_schema_file(ns: argparse.Namespace, v: str) -> None:
    if not os.path.isfile(v) or not os.access(v, os.R_OK):
        raise Invalid(f"error: failed to open file '{v}'\n")
    _grammar("--json-schema-file", "json", read=True)(ns, v)


def _version(ns: argparse.Namespace) -> None:
    from api.cli_info import version_text

    raise Exit(0, stderr=version_text())


def _cache_list(ns: argparse.Namespace) -> None:
    from api.cli_info import cached_models

    models = cached_models()
    raise Exit(0, stdout=f"number of models in cache: {len(models)}\n" +
               "".join(f"{i + 1:4d}. {m}\n" for i, m in enumerate(models)))


NO_SPEED = "speed only: tritium uses the -t threads for every batch"
OPTIONS = [
    opt(("-h", "--help", "--usage"), None, const("usage"), effect=Effect.EXIT),
    opt(("--version",), None, _version, effect=Effect.EXIT),
    opt(("-cl", "--cache-list"), None, _cache_list, effect=Effect.EXIT),
    opt(("--completion-bash",), None, const("completion"), effect=Effect.EXIT),
    opt(("-t", "--threads"), "N", _threads, kind=Kind.INT, env="LLAMA_ARG_THREADS",
        note="default here: torch's thread count"),
    opt(("-tb", "--threads-batch"), "N", nothing, kind=Kind.INT, effect=N, note=NO_SPEED),
    opt(("-C", "--cpu-mask"), "M", _add_cpus(cpu_mask)),
    opt(("-Cr", "--cpu-range"), "lo-hi", _add_cpus(cpu_range)),
    opt(("--cpu-strict",), "<0|1>", checked(stoul), effect=N, note="thread placement: speed only"),
    opt(("--prio",), "N", checked(_prio(-1), "prio"), kind=Kind.INT),
    opt(("--poll",), "<0...100>", checked(stoul), effect=N, note="busy-waiting: speed only"),
    opt(("-Cb", "--cpu-mask-batch"), "M", checked(cpu_mask), effect=N, note=NO_SPEED + " and -C/-Cr CPUs"),
    opt(("-Crb", "--cpu-range-batch"), "lo-hi", checked(cpu_range), effect=N, note=NO_SPEED + " and -C/-Cr CPUs"),
    opt(("--cpu-strict-batch",), "<0|1>", nothing, kind=Kind.INT, effect=N, note="thread placement: speed only"),
    opt(("--prio-batch",), "N", checked(_prio(0)), kind=Kind.INT, effect=N, note="--prio sets the whole process"),
    opt(("--poll-batch",), "<0|1>", nothing, kind=Kind.INT, effect=N, note="busy-waiting: speed only"),
    opt(("-lcs", "--lookup-cache-static"), "FNAME", store("lookup_cache_static"),
        note="--spec-type ngram-cache's static cache (llama.cpp's file format)"),
    opt(("-lcd", "--lookup-cache-dynamic"), "FNAME", store("lookup_cache_dynamic"),
        note="--spec-type ngram-cache's dynamic cache (read, not written, as b1-0c1e570)"),
    opt(("-c", "--ctx-size"), "N", store("ctx_size"), kind=Kind.INT, env="LLAMA_ARG_CTX_SIZE",
        note="default here: 4096 (0 = the model's training context)"),
    opt(("--kv-unified-per-slot",), "N", store("kv_unified_per_slot"), kind=Kind.INT,
        env="LLAMA_ARG_KV_UNIFIED_PER_SLOT", section=Section.SERVER),
    opt(("-n", "--predict", "--n-predict"), "N", store("n_predict"), kind=Kind.INT, env="LLAMA_ARG_N_PREDICT"),
    opt(("-b", "--batch-size"), "N", store("batch_size"), kind=Kind.INT, env="LLAMA_ARG_BATCH"),
    opt(("-ub", "--ubatch-size"), "N", store("ubatch_size"), kind=Kind.INT, env="LLAMA_ARG_UBATCH"),
    opt(("--keep",), "N", store("n_keep"), kind=Kind.INT),
    opt(("--swa-full",), None, const("swa_full"), env="LLAMA_ARG_SWA_FULL"),
    opt(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), "N", store("ctx_checkpoints"), kind=Kind.INT,
        env="LLAMA_ARG_CTX_CHECKPOINTS", section=Section.SERVER),
    opt(("-cms", "--checkpoint-min-step"), "N", checked(_non_negative_step), kind=Kind.INT,
        env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT", effect=N, section=Section.SERVER,
        note="where context checkpoints are kept: which prompt prefixes are reused, not what is computed"),
    opt(("-cram", "--cache-ram"), "N", store("cache_ram"), kind=Kind.INT, env="LLAMA_ARG_CACHE_RAM",
        section=Section.SERVER),
    opt(("-kvu", "--kv-unified"), None, store("kv_unified"), neg=("-no-kvu", "--no-kv-unified"),
        env="LLAMA_ARG_KV_UNIFIED", section=Section.SERVER),
    opt(("--cache-idle-slots",), None, store("cache_idle_slots"), neg=("--no-cache-idle-slots",),
        env="LLAMA_ARG_CACHE_IDLE_SLOTS", section=Section.SERVER),
    opt(("--context-shift",), None, store("ctx_shift"), neg=("--no-context-shift",), env="LLAMA_ARG_CONTEXT_SHIFT",
        section=Section.SERVER),
    opt(("-fa", "--flash-attn"), "[on|off|auto]", checked(_on_off_auto("--flash-attn"), "flash_attn"),
        env="LLAMA_ARG_FLASH_ATTN", effect=N,
        note="tritium's attention is one kernel either way: same output (off with a quantized -ctv: b1's refusal)"),
    opt(("--perf",), None, nothing, neg=("--no-perf",), env="LLAMA_ARG_PERF", effect=N,
        note="libllama's internal timings; the responses' timings are always there"),
    opt(("-e", "--escape"), None, store("escape"), neg=("--no-escape",)),
    opt(("-r", "--reverse-prompt"), "PROMPT", lambda ns, v: setattr(ns, "antiprompt", ns.antiprompt + [v]),
        section=Section.SERVER),
    opt(("-sp", "--special"), None, const("special"), section=Section.SERVER),
    opt(("--warmup",), None, store("warmup"), neg=("--no-warmup",), section=Section.SERVER),
    opt(("--spm-infill",), None, const("spm_infill"), section=Section.SERVER),
    # sampling
    opt(("--samplers",), "SAMPLERS", lambda ns, v: setattr(ns, "samplers", samplers_from_names(v)), section=S),
    opt(("-s", "--seed"), "SEED", store("seed", stoul), section=S),
    opt(("--sampler-seq", "--sampling-seq"), "SEQUENCE", lambda ns, v: setattr(ns, "samplers", samplers_from_chars(v)),
        section=S),
    opt(("--ignore-eos",), None, const("ignore_eos"), section=S),
    opt(("--temp", "--temperature"), "N", store("temp", lambda v: max(stof(v), 0.0)), env="LLAMA_ARG_TEMPERATURE",
        section=S),
    opt(("--top-k",), "N", store("top_k"), kind=Kind.INT, env="LLAMA_ARG_TOP_K", section=S),
    opt(("--top-p",), "N", store("top_p", stof), env="LLAMA_ARG_TOP_P", section=S),
    opt(("--min-p",), "N", store("min_p", stof), env="LLAMA_ARG_MIN_P", section=S),
    opt(("--top-nsigma", "--top-n-sigma"), "N", store("top_nsigma", stof), section=S),
    opt(("--xtc-probability",), "N", store("xtc_probability", stof), section=S),
    opt(("--xtc-threshold",), "N", store("xtc_threshold", stof), section=S),
    opt(("--typical", "--typical-p"), "N", store("typical", stof), section=S),
    opt(("--repeat-last-n",), "N", checked(_min("repeat-last-n", 0), "repeat_last_n"), kind=Kind.INT, section=S),
    opt(("--repeat-penalty",), "N", checked(_repeat_penalty, "repeat_penalty"), env="LLAMA_ARG_REPEAT_PENALTY",
        section=S),
    opt(("--presence-penalty",), "N", checked(_finite("presence-penalty"), "presence_penalty"),
        env="LLAMA_ARG_PRESENCE_PENALTY", section=S),
    opt(("--frequency-penalty",), "N", checked(_finite("frequency-penalty"), "frequency_penalty"),
        env="LLAMA_ARG_FREQUENCY_PENALTY", section=S),
    opt(("--dry-multiplier",), "N", store("dry_multiplier", stof), section=S),
    opt(("--dry-base",), "N", _dry_base, section=S),
    opt(("--dry-allowed-length",), "N", store("dry_allowed_length"), kind=Kind.INT, section=S),
    opt(("--dry-penalty-last-n",), "N", checked(_min("dry-penalty-last-n", 0), "dry_penalty_last_n"), kind=Kind.INT,
        section=S),
    opt(("--dry-sequence-breaker",), "STRING", _dry_breaker, section=S),
    opt(("--adaptive-target",), "N", store("adaptive_target", stof), section=S, effect=Effect.PENDING,
        note="the adaptive-p sampler",
        startup=lambda ns: "the adaptive-p sampler (--adaptive-target >= 0) is not supported yet"
        if ns.adaptive_target >= 0 else None),
    opt(("--adaptive-decay",), "N", store("adaptive_decay", stof), section=S, effect=N,
        note="used by the adaptive-p sampler only (see --adaptive-target)"),
    opt(("--dynatemp-range",), "N", store("dynatemp_range", stof), section=S),
    opt(("--dynatemp-exp",), "N", store("dynatemp_exp", stof), section=S),
    opt(("--mirostat",), "N", store("mirostat"), kind=Kind.INT, section=S),
    opt(("--mirostat-lr",), "N", store("mirostat_lr", stof), section=S),
    opt(("--mirostat-ent",), "N", store("mirostat_ent", stof), section=S),
    opt(("-l", "--logit-bias"), "TOKEN_ID(+/-)BIAS", _logit_bias, section=S),
    opt(("--grammar",), "GRAMMAR", _grammar("--grammar", "gbnf"), section=S),
    opt(("--grammar-file",), "FNAME", _grammar("--grammar-file", "gbnf", read=True), section=S),
    opt(("-j", "--json-schema"), "SCHEMA", _grammar("--json-schema", "json"), section=S),
    opt(("-jf", "--json-schema-file"), "FILE", _json_schema_file, section=S),
    opt(("-bs", "--backend-sampling"), None, nothing, env="LLAMA_ARG_BACKEND_SAMPLING", section=S, effect=N,
        note="samples on the device: the same distributions"),
]

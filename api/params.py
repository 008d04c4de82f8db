"""Request JSON -> `runtime.tasks` dataclasses, and the `generation_settings` echo.

Mirrors `params_from_json_cmpl` (tools/server/server-task.cpp): every field is optional, falls back
to the server's defaults, and a value of the wrong JSON type is a 400
`Field 'temperature': [json.exception.type_error.302] type must be number, but is string`.
"""
from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any, Callable

from api.errors import ApiError, json_type_name
from runtime.sampling.samplers import dry_breaker_ids
from runtime.tasks import DEFAULT_SAMPLERS, CompletionTask, SamplingParams

# one-letter sampler names of `--sampling-seq` / a string `samplers` field (common/sampling.cpp)
SAMPLER_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                 "m": "min_p", "x": "xtc", "t": "temperature"}
KNOWN_SAMPLERS = set(DEFAULT_SAMPLERS) | {"infill", "logit_bias"}


def f32(x: float) -> float:
    """A float stored as C++ `float` and printed as double (0.8 -> 0.800000011920929)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


class Fields:
    """Typed, null-tolerant reads of a request object (llama-server's `json_value`)."""

    _CHECK: dict[str, Callable[[Any], bool]] = {
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }

    def __init__(self, data: dict[str, Any]):
        self.data = data

    def lenient(self, key: str, kind: str, default: Any) -> Any:
        """llama-server's `json_value` where it is not a schema field: a value of another type is
        the default (b1 logs a warning), not an error."""
        v = self.data.get(key)
        return v if v is not None and self._CHECK[kind](v) else default

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, kind: str, default: Any = None) -> Any:
        v = self.data.get(key)
        if v is None:
            return default
        if not self._CHECK[kind](v):
            raise ApiError(f"Field '{key}': [json.exception.type_error.302] type must be {kind}, "
                           f"but is {json_type_name(v)}")
        return v

    def number(self, key: str, default: float) -> float:
        return float(self.get(key, "number", default))

    def integer(self, key: str, default: int) -> int:
        v = self.get(key, "number", default)
        if isinstance(v, float) and not math.isfinite(v):
            raise ApiError(f"Field '{key}': value must be finite")
        return int(v)

    def boolean(self, key: str, default: bool) -> bool:
        return self.get(key, "boolean", default)

    def string(self, key: str, default: str) -> str:
        return self.get(key, "string", default)

    def array(self, key: str, default: list | None = None) -> list | None:
        return self.get(key, "array", default)


def _parse_logit_bias(raw: Any, tokenizer: Any, n_vocab: int) -> list[tuple[int, float]]:
    """`[[id|text, bias|false], ...]` or the OpenAI `{"id": bias}` form; text is tokenized and every
    token gets the bias; `false` bans (-inf)."""
    out: list[tuple[int, float]] = []

    def bias_of(v: Any) -> float | None:
        if isinstance(v, bool):
            return -math.inf if v is False else None
        if isinstance(v, (int, float)):
            return f32(float(v))
        return None

    def add(tok: Any, bias: float | None) -> None:
        if bias is None:
            return
        if isinstance(tok, int) and not isinstance(tok, bool):
            if 0 <= tok < n_vocab:
                out.append((tok, bias))
        elif isinstance(tok, str):
            for t in tokenizer.encode(tok, add_special=False, parse_special=False):
                out.append((t, bias))

    if isinstance(raw, list):
        for el in raw:
            if isinstance(el, list) and len(el) == 2:
                add(el[0], bias_of(el[1]))
    elif isinstance(raw, dict):
        for key, v in raw.items():
            try:
                tok: Any = int(key)
            except ValueError:
                tok = key
            add(tok, bias_of(v))
    return out  # any other value: no biases (b1 reads only arrays and objects)


def eog_bias_ids(tokenizer: Any) -> list[int]:
    """The end-of-generation tokens `ignore_eos` bans, in id order (common.cpp's logit_bias_eog)."""
    return sorted(getattr(tokenizer, "eot_ids", ()) or ())


MAX_SAMPLERS = 16  # tritium's bound on a request's sampler chain (llama-server has none)
_IDEMPOTENT = {"top_k", "min_p"}  # applying one twice in a row changes nothing


def _parse_samplers(raw: Any) -> list[str] | None:
    """b1: an array of names (each a string) or a string of sampler chars; other values: ignored.
    The chain runs once per token, so its length is bounded: a repeat of an idempotent sampler
    right after itself is dropped (same result), and the chain stops after MAX_SAMPLERS."""
    if isinstance(raw, str):
        names = [SAMPLER_CHARS[c] for c in raw if c in SAMPLER_CHARS]
    elif isinstance(raw, list):
        for s in raw:
            if not isinstance(s, str):
                raise ApiError(f"Field 'samplers': [json.exception.type_error.302] type must be string, "
                               f"but is {json_type_name(s)}")
        names = [s for s in raw if s in KNOWN_SAMPLERS]
    else:
        return None
    out: list[str] = []
    for s in names:
        if out and s == out[-1] and s in _IDEMPOTENT:
            continue
        out.append(s)
        if len(out) >= MAX_SAMPLERS:
            break
    return out


I32_MAX, I64_MAX, FLT_MAX = 2**31 - 1, 2**63 - 1, 3.4028234663852886e38
# b1-0c1e570's schema (tools/server/server-schema.cpp): fields whose value must lie in a range
# (set_hard_limits: outside it is a 400) and fields that are clamped into one (set_limits)
HARD_LIMITS: dict[str, tuple[float, float]] = {
    "sse_ping_interval": (-1, I32_MAX), "n_predict": (-1, I32_MAX), "max_completion_tokens": (-1, I32_MAX),
    "max_tokens": (-1, I32_MAX), "n_indent": (0, I32_MAX), "n_keep": (-1, I32_MAX), "n_discard": (0, I32_MAX),
    "n_cache_reuse": (0, I32_MAX), "t_max_predict_ms": (-1, I64_MAX), "repeat_last_n": (0, I32_MAX),
    "dry_allowed_length": (0, I32_MAX), "dry_penalty_last_n": (0, I32_MAX), "adaptive_decay": (0.0, 0.99),
    "min_keep": (0, I32_MAX), "reasoning_budget_tokens": (-1, I32_MAX),
}
CLAMPED: dict[str, tuple[float, float]] = {
    "top_k": (0, I32_MAX), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0), "xtc_probability": (0.0, 1.0),
    "xtc_threshold": (0.0, 1.0), "temperature": (0.0, math.inf), "mirostat": (0, 2), "adaptive_target": (-FLT_MAX, 1.0),
}
_FLOAT_FIELDS = {"adaptive_decay"}


def check_schema_fields(body: dict[str, Any]) -> None:
    """The checks of b1's schema that the typed reads below do not make: the types of chat_format
    (a number; a boolean converts) and reasoning_format, then the ranges of HARD_LIMITS ("Field
    'n_keep': Value must be between -1 <= value <= 2147483647, but got -5": std::to_string of the
    bounds and value, floats with six decimals). Of n_predict's names only the first present is
    read (n_predict, max_completion_tokens, max_tokens)."""
    for name, kind, ok in (("chat_format", "number", lambda v: isinstance(v, (int, float))),
                           ("reasoning_format", "string", lambda v: isinstance(v, str))):
        if body.get(name) is not None and not ok(body[name]):
            raise ApiError(f"Field '{name}': [json.exception.type_error.302] type must be {kind}, "
                           f"but is {json_type_name(body[name])}")
    seen_n_predict = False
    for name, (lo, hi) in HARD_LIMITS.items():
        v = body.get(name)
        if v is None:
            continue
        if name in ("n_predict", "max_completion_tokens", "max_tokens"):
            if seen_n_predict:
                continue
            seen_n_predict = True
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ApiError(f"Field '{name}': [json.exception.type_error.302] type must be number, "
                           f"but is {json_type_name(v)}")
        is_float = name in _FLOAT_FIELDS
        got = f32(float(v)) if is_float else int(v)  # get<int32_t>: a float truncates
        if got < lo or got > hi:
            fmt = (lambda x: f"{x:f}") if is_float else (lambda x: str(int(x)))
            raise ApiError(f"Field '{name}': Value must be between {fmt(lo)} <= value <= {fmt(hi)}, but got {fmt(got)}")


N_PROBS_MAX = 100  # n_probs / top_logprobs above this are capped (llama-server caps only at n_vocab)


def parse_sampling(body: dict[str, Any], defaults: SamplingParams, tokenizer: Any, n_ctx_slot: int,
                   schema_to_grammar: Callable[[Any], str] | None = None) -> SamplingParams:
    """SamplingParams of a request: every field of `SamplingParams` read under its own JSON name."""
    check_schema_fields(body)
    f = Fields(body)
    p = dataclasses.replace(defaults, dry_sequence_breakers=list(defaults.dry_sequence_breakers),
                            logit_bias=list(defaults.logit_bias), samplers=list(defaults.samplers),
                            grammar_triggers=list(defaults.grammar_triggers),
                            preserved_tokens=list(defaults.preserved_tokens))
    for fld in dataclasses.fields(SamplingParams):
        name = fld.name
        if name in ("logit_bias", "samplers", "grammar", "grammar_triggers", "preserved_tokens",
                    "dry_sequence_breakers", "dry_breaker_ids", "seed"):
            continue
        cur = getattr(p, name)
        if isinstance(cur, bool):
            setattr(p, name, f.boolean(name, cur))
        elif isinstance(cur, int):
            setattr(p, name, f.integer(name, cur))
        elif isinstance(cur, float):
            setattr(p, name, f32(f.number(name, cur)))
    for name, (lo, hi) in CLAMPED.items():  # b1's set_limits: clamped, not refused
        if hasattr(p, name) and f.has(name):
            v = getattr(p, name)
            setattr(p, name, type(v)(min(max(v, lo), hi)))
    p.seed = f.integer("seed", p.seed) & 0xFFFFFFFF
    p.n_probs = min(p.n_probs, N_PROBS_MAX)  # the effective value is echoed in generation_settings
    if p.repeat_last_n == -1:
        p.repeat_last_n = n_ctx_slot
    if p.dry_penalty_last_n == -1:
        p.dry_penalty_last_n = n_ctx_slot
    if p.dry_base < 1.0:
        p.dry_base = defaults.dry_base
    breakers = f.array("dry_sequence_breakers")
    if breakers is not None:
        if not breakers or not all(isinstance(s, str) for s in breakers):
            raise ApiError("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings")
        p.dry_sequence_breakers = list(breakers)
    if p.dry_multiplier > 0:  # tokenized here, off the engine thread (a list of any length)
        p.dry_breaker_ids = dry_breaker_ids(tokenizer, p.dry_sequence_breakers)
    samplers = _parse_samplers(body.get("samplers"))
    if samplers is not None:
        p.samplers = samplers
    if body.get("logit_bias") is not None:
        p.logit_bias = _parse_logit_bias(body["logit_bias"], tokenizer, tokenizer.n_vocab)
    if body.get("ignore_eos") is not None and p.ignore_eos:
        # llama-server adds a -inf bias per end-of-generation token (echoed in generation_settings)
        p.logit_bias.extend((t, -math.inf) for t in eog_bias_ids(tokenizer))
    grammar = f.string("grammar", "")
    schema = body.get("json_schema")
    if schema is not None and grammar:
        raise ApiError('Either "json_schema" or "grammar" can be specified, but not both')
    if schema is not None:
        p.grammar = schema_to_grammar_or_400(schema, schema_to_grammar)
    elif body.get("grammar") is not None:
        p.grammar = grammar
    # else: the server's --grammar / --json-schema default ("" without one)
    p.grammar_lazy = f.boolean("grammar_lazy", p.grammar_lazy)
    _reasoning_tags(body, p, tokenizer)
    return p


def _reasoning_tags(body: dict[str, Any], p: SamplingParams, tokenizer: Any) -> None:
    """reasoning_budget_start_tag / reasoning_budget_end_tags (or _end_tag) / reasoning_budget_message
    as token ids (b1's schema; a chat request gets them from its template: api/chat.py)."""
    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special=False, parse_special=True))
    start = body.get("reasoning_budget_start_tag")
    if isinstance(start, str):
        p.reasoning_start = ids(start)
    ends = body.get("reasoning_budget_end_tags", body.get("reasoning_budget_end_tag"))
    if isinstance(ends, str):
        ends = [ends]
    if isinstance(ends, list):
        p.reasoning_end = [ids(t) for t in ends if isinstance(t, str) and t]
    if "reasoning_budget_message" in body and p.reasoning_end:
        msg = body["reasoning_budget_message"]
        p.reasoning_forced = (ids(msg) if isinstance(msg, str) and msg else []) + list(p.reasoning_end[0])


# b1-0c1e570's prefix for a chat schema (response_format, a tool's parameters) its generated chat
# parser cannot convert (common/chat.cpp)
CHAT_PARSER_FAILED = "Unable to generate parser for this template. Automatic parser generation failed: "


def schema_to_grammar_or_400(schema: Any, convert: Callable[[Any], str] | None = None,
                             chat: bool = False) -> str:
    """GBNF for a JSON schema; a schema the converter refuses is a 400 worded as b1-0c1e570 words it.

    /completion's `json_schema` (server-schema.cpp's field handler, under handle_with_catch):
    `Field 'json_schema': "json_schema": JSON schema conversion failed:\n<error>`. A chat
    response_format (`chat`), whose schema the generated chat parser converts (common/chat.cpp): `Unable to generate parser for
    this template. Automatic parser generation failed: <error>`, and a schema that is not an object
    is no response format there ("": no grammar). <error> is the validation's own text ("JSON schema
    error at #: ...", grammar.json_schema_check), or the converter's after "JSON schema conversion
    failed:\n"."""
    if convert is None:
        from grammar import json_schema_to_gbnf as convert  # noqa: N813
    if chat and not isinstance(schema, dict):
        return ""
    try:
        return convert(schema)
    except ApiError:
        raise
    except Exception as e:  # GrammarError, or a malformed schema
        from grammar.json_schema_check import JsonSchemaError
        error = str(e) if chat and isinstance(e, JsonSchemaError) else f"JSON schema conversion failed:\n{e}"
        if chat:
            raise ApiError(CHAT_PARSER_FAILED + error) from e
        raise ApiError(f"Field 'json_schema': \"json_schema\": {error}") from e


def parse_stop(raw: Any, openai: bool) -> list[str]:
    """b1's "stop" field: one string, or an array of strings (empty ones skipped; another element is
    its type error); any other value gives no stop strings."""
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        return []
    for s in raw:
        if s is not None and not isinstance(s, str):
            raise ApiError(f"Field 'stop': [json.exception.type_error.302] type must be string, but is "
                           f"{json_type_name(s)}")
    return [s for s in raw if s]


def parse_task(body: dict[str, Any], prompt_tokens: list[int], params: SamplingParams, n_predict_default: int,
               openai: bool = False, defaults: Any = None) -> CompletionTask:
    """The CompletionTask of a request whose prompt is already tokenized; `defaults` (a
    context.RequestDefaults): the command line's n_keep, cache_prompt and stop strings."""
    f = Fields(body)
    stop = parse_stop(body.get("stop"), openai)
    if defaults is not None and not stop:  # b1: no effective stop strings -> the -r ones
        stop = list(defaults.stop)
    # b1's schema: the first present of n_predict, max_completion_tokens, max_tokens
    n_predict = f.integer("n_predict", f.integer("max_completion_tokens", f.integer("max_tokens", n_predict_default)))
    n_cache_reuse = f.integer("n_cache_reuse", -1) if f.has("n_cache_reuse") else None
    return CompletionTask(
        prompt_tokens=prompt_tokens,
        params=params,
        n_predict=n_predict,
        n_indent=f.integer("n_indent", 0),
        stop=stop,
        id_slot=f.integer("id_slot", -1),
        cache_prompt=f.boolean("cache_prompt", True if defaults is None else defaults.cache_prompt),
        n_cache_reuse=n_cache_reuse,
        n_keep=f.integer("n_keep", 0 if defaults is None else defaults.n_keep),
        n_discard=f.integer("n_discard", 0),
        stream=f.boolean("stream", False),
        return_tokens=f.boolean("return_tokens", False),
        t_max_predict_ms=f.integer("t_max_predict_ms", -1),
        lora=parse_lora(body.get("lora")),
        return_progress=f.boolean("return_progress", False),
        timings_per_token=f.boolean("timings_per_token", False),
    )


def parse_lora(value: Any) -> dict[int, float] | None:
    """A request's `lora` ([{id, scale}], llama-server's parse_lora_request: id -1 and scale 0 when
    missing; later entries win); None when absent or empty (the server's adapters apply)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError("Field 'lora': Error: 'lora' must be an array of objects with 'id' and 'scale' fields")
    out: dict[int, float] = {}
    for entry in value:
        f = Fields(entry if isinstance(entry, dict) else {})
        out[f.integer("id", -1)] = f32(f.number("scale", 0.0))
    return out or None




def reasoning_format_name(fmt: str) -> str:
    """A reasoning format as generation_settings echo it: b1-0c1e570's built-in default
    (`common_params::reasoning_format`, our "auto") prints as "deepseek"."""
    return "deepseek" if fmt == "auto" else fmt


def sampling_settings(p: SamplingParams, n_predict: int, stream: bool, chat_format: str, reasoning_format: str,
                      only_metrics: bool, stop: list[str] | None = None, n_keep: int = 0, n_discard: int = 0,
                      timings_per_token: bool = False, post_sampling_probs: bool = False,
                      generation_prompt: str = "", spec_types: str = "none") -> dict[str, Any]:
    """`task_params::to_json` of the pinned build: the full echo (`generation_settings`) or the
    `only_metrics` subset used by /props and /slots."""
    d: dict[str, Any] = {
        "seed": p.seed,
        "temperature": p.temperature,
        "dynatemp_range": p.dynatemp_range,
        "dynatemp_exponent": p.dynatemp_exponent,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "top_n_sigma": p.top_n_sigma,
        "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold,
        "typical_p": p.typical_p,
        "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": p.dry_multiplier,
        "dry_base": p.dry_base,
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n,
    }
    if not only_metrics:
        d["dry_sequence_breakers"] = list(p.dry_sequence_breakers)
    d.update({"mirostat": p.mirostat, "mirostat_tau": f32(p.mirostat_tau), "mirostat_eta": f32(p.mirostat_eta),
              "adaptive_target": f32(p.adaptive_target), "adaptive_decay": f32(p.adaptive_decay)})
    if not only_metrics:
        d["stop"] = list(stop or [])
    d.update({"max_tokens": n_predict, "n_predict": n_predict, "n_keep": n_keep, "n_discard": n_discard,
              "ignore_eos": p.ignore_eos, "stream": stream})
    if not only_metrics:
        d["logit_bias"] = [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in p.logit_bias]
    d.update({"n_probs": p.n_probs, "min_keep": p.min_keep})
    if not only_metrics:
        d.update({"grammar": p.grammar, "grammar_lazy": p.grammar_lazy,
                  "grammar_triggers": [{"type": 1, "value": t} for t in p.grammar_triggers],
                  "preserved_tokens": list(p.preserved_tokens)})
    d.update({
        "chat_format": chat_format,
        "reasoning_format": reasoning_format,
        "reasoning_in_content": False,
        "generation_prompt": generation_prompt,
        "samplers": list(p.samplers),
        "speculative.types": spec_types,
        "timings_per_token": timings_per_token,
        "post_sampling_probs": post_sampling_probs,
        "backend_sampling": False,
        "lora": [],
    })
    return d

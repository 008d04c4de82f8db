"""The variables a chat template sees besides the messages, as llama-server b1-0c1e570 builds them.

Server defaults (`ServerConfig.template_kwargs`, each value as JSON text): `--chat-template-kwargs`,
`--reasoning on|off` (`enable_thinking`), `--reasoning-effort LEVEL` (`reasoning_effort`),
`--reasoning-preserve` / `--no-reasoning-preserve` (`preserve_reasoning`, "true" unless given:
common_params_parse_ex). A request's `chat_template_kwargs` replace them key by key
(oaicompat_chat_params_parse); its `reasoning_effort` field sets that kwarg ("none" turns thinking
off instead). `enable_thinking` starts from whether the template thinks (and not `--reasoning
off`), then a kwarg `true`/`false` decides it; a string there is a 400.

At render (common_chat_template_direct_apply_impl): the kwargs are variables, after
`enable_thinking`; a boolean `preserve_reasoning` also sets `preserve_thinking` and, negated,
`clear_thinking`, `truncate_history_thinking` and `drop_thinking`; a non-empty string
`reasoning_effort` also sets `reasoning_strength` (jinja::caps_apply_*: set before the kwargs, so
a kwarg of the same name wins).
"""
from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError

PRESERVE_VARS = ("clear_thinking", "truncate_history_thinking", "drop_thinking")


def dump(value: Any) -> str:
    """nlohmann's dump(): compact JSON, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def server_kwargs(template_kwargs: dict[str, str]) -> dict[str, str]:
    """The server's default kwargs (JSON texts): preserve_reasoning is "true" unless a flag set it."""
    out = dict(template_kwargs)
    out.setdefault("preserve_reasoning", "true")
    return out


def template_thinks(tmpl: Any) -> bool:
    """Whether the template has a reasoning block (common_chat_templates_support_enable_thinking:
    its generated parser finds reasoning markers; here: the template writes <think> tags)."""
    return getattr(tmpl, "thinking_tags", None) is not None


def request_kwargs(cfg: Any, tmpl: Any, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the kwargs as values, enable_thinking) of a chat request (oaicompat_chat_params_parse)."""
    kw = server_kwargs(getattr(cfg, "template_kwargs", {}) or {})
    ctk = body.get("chat_template_kwargs")
    if ctk is not None:
        if not isinstance(ctk, dict):
            raise ApiError("chat_template_kwargs must be an object")
        for k, v in ctk.items():
            kw[k] = dump(v)
    enable = getattr(cfg, "enable_thinking", None) is not False and template_thinks(tmpl)
    et = kw.get("enable_thinking", "")
    if et == "true":
        enable = True
    elif et == "false":
        enable = False
    elif et.startswith('"'):
        raise ApiError('invalid type for "enable_thinking" (expected boolean, got string)')
    if "reasoning_effort" in body:
        effort = body["reasoning_effort"] if isinstance(body["reasoning_effort"], str) else ""
        if effort == "none":
            enable = False
            kw.pop("reasoning_effort", None)
        elif effort:
            kw["reasoning_effort"] = dump(effort)
    return {k: json.loads(v) for k, v in kw.items()}, enable


def template_variables(kwargs: dict[str, Any], enable_thinking: bool) -> dict[str, Any]:
    """The variables the template is rendered with (besides messages, tools, bos/eos and
    add_generation_prompt): the caps' variables, then enable_thinking, then the kwargs."""
    out: dict[str, Any] = {}
    pr = kwargs.get("preserve_reasoning")
    if isinstance(pr, bool):
        out["preserve_thinking"] = pr
        out.update({k: not pr for k in PRESERVE_VARS})
    effort = kwargs.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        out["reasoning_effort"] = out["reasoning_strength"] = effort
    out["enable_thinking"] = enable_thinking
    out.update(kwargs)
    return out

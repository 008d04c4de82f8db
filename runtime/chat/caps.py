"""llama.cpp's `chat_template_caps` of a template, found by probing renders.

The probe renders sample conversations with containers that record which paths the template reads
(llama.cpp's `common/jinja/caps.cpp` does the same with its own interpreter's usage statistics):
a template that never reads `tools[0].function.name` does not support tools, one that reads the
second tool call supports parallel calls, and so on.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta

CAPS_KEYS = (
    "supports_object_arguments",
    "supports_parallel_tool_calls",
    "supports_preserve_reasoning",
    "supports_reasoning_effort",
    "supports_string_content",
    "supports_system_role",
    "supports_tool_calls",
    "supports_tools",
    "supports_typed_content",
)


# ---------------------------------------------------------------------------------------------
# containers that record which paths the template reads

class _Usage:
    def __init__(self) -> None:
        self.used: set[tuple] = set()


class _TStr(str):
    """A string that records array-style access (typed content probing)."""

    def __new__(cls, value: str, usage: _Usage, path: tuple):
        s = super().__new__(cls, value)
        s._usage = usage
        s._path = path
        return s

    def __iter__(self):
        self._usage.used.add(self._path + ("[]",))
        return super().__iter__()

    def __getitem__(self, k):
        if isinstance(k, int):
            self._usage.used.add(self._path + ("[]",))
        return super().__getitem__(k)


def _wrap(value: Any, usage: _Usage, path: tuple) -> Any:
    if isinstance(value, dict):
        return _TDict(value, usage, path)
    if isinstance(value, list):
        return _TList(value, usage, path)
    if isinstance(value, str):
        return _TStr(value, usage, path)
    return value


class _TDict(dict):
    def __init__(self, value: dict, usage: _Usage, path: tuple):
        super().__init__({k: _wrap(v, usage, path + (k,)) for k, v in value.items()})
        self._usage = usage
        self._path = path

    def __getitem__(self, k):
        v = super().__getitem__(k)
        self._usage.used.add(self._path + (k,))
        return v

    def get(self, k, default=None):
        if k in self:
            return self[k]
        return default

    def items(self):
        for k in self.keys():
            self._usage.used.add(self._path + (k,))
        return super().items()

    def values(self):
        for k in self.keys():
            self._usage.used.add(self._path + (k,))
        return super().values()


class _TList(list):
    def __init__(self, value: list, usage: _Usage, path: tuple):
        super().__init__(_wrap(v, usage, path + (i,)) for i, v in enumerate(value))
        self._usage = usage
        self._path = path

    def _mark(self):
        self._usage.used.add(self._path)

    def __iter__(self):
        self._mark()
        return super().__iter__()

    def __len__(self):
        self._mark()
        return super().__len__()

    def __bool__(self):
        self._mark()
        return super().__len__() > 0

    def __getitem__(self, k):
        self._mark()
        return super().__getitem__(k)


class _ArrayProbe(list):
    """An empty content list that records being iterated or indexed (b1's array_access / selectattr)."""

    def __init__(self, usage: _Usage, path: tuple):
        super().__init__()
        self._usage, self._path = usage, path

    def __iter__(self):
        self._usage.used.add(self._path + ("[]",))
        return super().__iter__()

    def __getitem__(self, k):
        self._usage.used.add(self._path + ("[]",))
        return super().__getitem__(k)


def touch(x: Any) -> None:
    """Mark every path inside a probed (_TDict / _TList) value as read (`tojson` reads all of it)."""
    if isinstance(x, dict):
        for v in x.values():
            touch(v)
    elif isinstance(x, list):
        for v in x:
            touch(v)


# ---------------------------------------------------------------------------------------------
# probes

def _probe_tools() -> list[dict]:
    return [{
        "name": "tool", "type": "function",
        "function": {"name": "tool1", "description": "Tool description",
                     "parameters": {"type": "object",
                                    "properties": {"arg": {"type": "string", "description": "Arg description"}},
                                    "required": ["arg"]}},
    }]


def _probe_call(id_: str, args: Any) -> dict:
    return {"id": id_, "type": "function", "function": {"name": "tool1", "arguments": args}}


@dataclass
class RenderResult:
    ok: bool
    text: str
    usage: _Usage


def try_render(template: jinja2.Template, messages: list[dict], tools: Any, wrap: bool = True,
               extra: dict[str, Any] | None = None) -> RenderResult:
    """Render a probe conversation (no special tokens, generation prompt on); `wrap` records reads."""
    usage = _Usage()
    msgs: Any = messages
    tls: Any = tools
    if wrap:
        msgs = _TList(messages, usage, ("messages",))
        tls = _TList(tools, usage, ("tools",)) if tools is not None else None
        usage.used.clear()
    ctx: dict[str, Any] = {"messages": msgs, "bos_token": "", "eos_token": "",
                           "add_generation_prompt": True}
    if tls is not None:
        ctx["tools"] = tls
    ctx.update(extra or {})
    try:
        text = template.render(**ctx)
        return RenderResult(True, text, usage)
    except Exception:  # noqa: BLE001 - any failure means "not supported"
        return RenderResult(False, "", usage)


def requires_object_arguments(template: jinja2.Template) -> bool:
    """True when the template only renders tool-call arguments given as objects (minja's
    polyfill then parses string arguments)."""
    needle = {"argument_needle": "print('Hello, World!')"}
    user = {"role": "user", "content": "Hey"}

    def renders(args: Any) -> bool:
        r = try_render(template, [user, {"role": "assistant", "content": "",
                                         "tool_calls": [_probe_call("call_1___", args)]}],
                       None, wrap=False)
        return r.ok and ('"argument_needle":' in r.text or "'argument_needle':" in r.text
                         or "<parameter=argument_needle>" in r.text)

    str_ok = renders(json.dumps(needle))
    obj_ok = renders(needle)
    return (not str_ok) and obj_ok


def detect_caps(template: jinja2.Template, env: jinja2.Environment, source: str) -> dict[str, bool]:
    """llama.cpp's chat_template_caps of `template` (compiled from `source` in `env`), keys sorted
    as the server prints them."""
    caps = {
        "supports_tools": True, "supports_tool_calls": True, "supports_system_role": True,
        "supports_parallel_tool_calls": True, "supports_preserve_reasoning": False,
        "supports_string_content": True, "supports_typed_content": False,
        "supports_object_arguments": False, "supports_reasoning_effort": False,
    }
    # typed content: content read as an array
    r = try_render(template, [{"role": "user", "content": "content"}], None)
    if ("messages", 0, "content", "[]") in r.usage.used:
        caps["supports_typed_content"] = True
    if not r.ok:
        caps["supports_string_content"] = False
    # b1 (common/jinja/caps.cpp): a template that tests `content is string` is probed once more with
    # an empty array as content; reading it as an array there (and rendering) means typed content too
    if not caps["supports_typed_content"] and re.search(r"\bis\s+string\b", source):
        usage = _Usage()
        probe = _TList([{"role": "user", "content": "x"}], usage, ("messages",))
        dict.__setitem__(probe[0], "content", _ArrayProbe(usage, ("messages", 0, "content")))
        usage.used.clear()
        try:
            template.render(messages=probe, bos_token="", eos_token="", add_generation_prompt=True)
            if ("messages", 0, "content", "[]") in usage.used:
                caps["supports_typed_content"] = True
        except Exception:  # noqa: BLE001 - a failed render: no typed content
            pass
    # system role: is the system message's content read?
    r = try_render(template, [{"role": "system", "content": "System message"},
                              {"role": "user", "content": "User message"}], [])
    if ("messages", 0, "content") not in r.usage.used:
        caps["supports_system_role"] = False
    # tools and tool calls, as llama.cpp's jinja caps (common/jinja/caps.cpp): one call with
    # object arguments first, then, unless the template read those, one with a JSON string
    def one_call(args: Any) -> list[dict]:
        return [
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [_probe_call("call00001", args)]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"},
        ]

    r = try_render(template, one_call({"arg": "value"}), _probe_tools())
    if r.ok:
        if ("tools", 0, "function", "name") not in r.usage.used:
            caps["supports_tools"] = False
        if ("messages", 1, "tool_calls") not in r.usage.used:
            caps["supports_tool_calls"] = False
        elif ("messages", 1, "tool_calls", 0, "function", "arguments", "arg") in r.usage.used:
            caps["supports_object_arguments"] = True
    if not caps["supports_object_arguments"]:
        r = try_render(template, one_call(json.dumps({"arg": "value"})), _probe_tools())
        if not r.ok:
            caps["supports_tool_calls"] = caps["supports_tools"] = False
        else:
            if ("tools", 0, "function", "name") not in r.usage.used:
                caps["supports_tools"] = False
            if ("messages", 1, "tool_calls") not in r.usage.used:
                caps["supports_tool_calls"] = False
    # parallel tool calls: two calls in one message, the second one read
    if caps["supports_tool_calls"]:
        args = {"arg": "value"} if caps["supports_object_arguments"] else json.dumps({"arg": "value"})
        msgs = one_call(args)
        msgs[1] = dict(msgs[1], tool_calls=[_probe_call("call00001", args), _probe_call("call00002", args)])
        r = try_render(template, msgs, _probe_tools())
        if not r.ok or ("messages", 1, "tool_calls", 1, "function") not in r.usage.used:
            caps["supports_parallel_tool_calls"] = False
    else:
        caps["supports_parallel_tool_calls"] = False
    # preserve reasoning: is reasoning_content deeper in the history printed?
    placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
    r = try_render(template, [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
        {"role": "user", "content": "User message"},
    ], [], extra={"enable_thinking": True, "preserve_thinking": True, "clear_thinking": False,  # caps_apply_
                  "truncate_history_thinking": False, "drop_thinking": False})            # preserve_reasoning
    if placeholder in r.text:
        caps["supports_preserve_reasoning"] = True
    # reasoning effort: does the template read the variable at all?
    caps["supports_reasoning_effort"] = "reasoning_effort" in jinja2.meta.find_undeclared_variables(
        env.parse(source))
    return {k: caps[k] for k in CAPS_KEYS}

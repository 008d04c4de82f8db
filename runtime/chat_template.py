"""Jinja chat templates rendered the way llama-server (`--jinja`) renders them.

`ChatTemplate(source, bos_token, eos_token)` renders OpenAI-style message lists with a sandboxed
Jinja environment configured like Hugging Face's (`trim_blocks`, `lstrip_blocks`, `loopcontrols`,
`raise_exception`, `strftime_now`, HF-style `tojson`). Messages are normalized first as llama.cpp
does (content parts joined, null content, tool-call arguments parsed to objects when the template
needs objects). `caps` reports llama.cpp's `chat_template_caps`, found by probing renders and
watching which message fields the template reads (llama.cpp's `common/jinja/caps.cpp` does the same
with its own interpreter's usage statistics). `detect_format(source)` names the chat format
llama.cpp's `common_chat_templates_apply` would pick for the template.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.meta
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The template carried by the Qwen2 vocab GGUF (`tokenizer.chat_template` of
# ggml-vocab-qwen2.gguf): plain ChatML that inserts a default system message.
# (the newlines inside its string literals are real newline characters, as in the GGUF)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

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

# chat format names as llama.cpp's common_chat_format_name() spells them
FORMAT_CONTENT_ONLY = "Content-only"
FORMAT_GENERIC = "Generic"
FORMAT_MISTRAL_NEMO = "Mistral Nemo"
FORMAT_LLAMA_3X = "Llama 3.x"
FORMAT_LLAMA_3X_BUILTIN = "Llama 3.x with builtin tools"
FORMAT_DEEPSEEK_R1 = "DeepSeek R1"
FORMAT_FIREFUNCTION_V2 = "FireFunction v2"
FORMAT_FUNCTIONARY_V3_2 = "Functionary v3.2"
FORMAT_FUNCTIONARY_V3_1_LLAMA_3_1 = "Functionary v3.1 Llama 3.1"
FORMAT_HERMES_2_PRO = "Hermes 2 Pro"
FORMAT_COMMAND_R7B = "Command R7B"


def default_chatml_template() -> str:
    """The ChatML template of the Qwen2 vocab GGUF, for models without a template of their own."""
    return CHATML_TEMPLATE


def detect_format(source: str, has_tools: bool = True, tool_choice: str = "auto",
                  has_json_schema: bool = False) -> str:
    """The chat format llama.cpp picks for this template source (common_chat_templates_apply_jinja).

    Some formats are chosen from the template text alone (DeepSeek R1, Hermes 2 Pro, Llama 3.x,
    ...), others only when the request carries tools (Mistral Nemo, Generic); a template without
    any tool syntax and no tools is `Content-only`.
    """
    src = source
    if "<｜tool▁calls▁begin｜>" in src and not has_json_schema:
        return FORMAT_DEEPSEEK_R1
    if "<|END_THINKING|><|START_ACTION|>" in src:
        return FORMAT_COMMAND_R7B
    if "<tool_call>" in src and not has_json_schema:
        return FORMAT_HERMES_2_PRO
    if has_tools and has_json_schema:
        return FORMAT_GENERIC
    if ">>>all" in src:
        return FORMAT_FUNCTIONARY_V3_2
    if " functools[" in src:
        return FORMAT_FIREFUNCTION_V2
    if "<|start_header_id|>" in src and "<function=" in src:
        return FORMAT_FUNCTIONARY_V3_1_LLAMA_3_1
    if "<|start_header_id|>ipython<|end_header_id|>" in src:
        return FORMAT_LLAMA_3X
    if not has_tools or tool_choice == "none":
        return FORMAT_CONTENT_ONLY
    if "[TOOL_CALLS]" in src:
        return FORMAT_MISTRAL_NEMO
    return FORMAT_GENERIC


# ---------------------------------------------------------------------------------------------
# helpers the templates call

def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's tojson: no HTML escaping (unlike Jinja's built-in filter), unicode kept as is
    _touch(x)  # capability probing: serializing a value reads all of it
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _touch(x: Any) -> None:
    """Mark every path inside a probed (_TDict / _TList) value as read."""
    if isinstance(x, dict):
        for v in x.values():
            _touch(v)
    elif isinstance(x, list):
        for v in x:
            _touch(v)


def _make_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# ---------------------------------------------------------------------------------------------
# message normalization (llama.cpp common_chat_msgs_parse_oaicompat + to_json_oaicompat)

def _content_to_string(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    return str(content)


def normalize_messages(messages: list[dict], object_arguments: bool = True) -> list[dict]:
    """Copies of `messages` as the template sees them.

    content: string parts joined with "\\n", null kept as None for assistant messages with tool
    calls, "" otherwise. tool_calls[].function.arguments: a JSON string is parsed to an object when
    `object_arguments` (templates that `| tojson` it need the object).
    """
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object")
        msg = dict(m)
        if "role" not in msg:
            raise ValueError("message is missing 'role'")
        content = _content_to_string(msg.get("content"))
        if content is None and not msg.get("tool_calls"):
            content = ""
        msg["content"] = content
        if msg.get("tool_calls"):
            calls = []
            for tc in msg["tool_calls"]:
                tc = dict(tc)
                fn = dict(tc.get("function") or {})
                args = fn.get("arguments")
                if object_arguments and isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        pass  # keep the text; the template renders what it can
                tc["function"] = fn
                tc.setdefault("type", "function")
                calls.append(tc)
            msg["tool_calls"] = calls
        elif "tool_calls" in msg and not msg["tool_calls"]:
            del msg["tool_calls"]
        out.append(msg)
    return out


# ---------------------------------------------------------------------------------------------
# capability probing: containers that record which paths the template reads

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


_PROBE_TOOLS = [{
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


class ChatTemplate:
    """A compiled chat template plus the special tokens it may print."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._env = _make_env()
        self._template = self._env.from_string(source)
        self._caps: dict[str, bool] | None = None
        self._requires_object_arguments: bool | None = None

    # -- rendering ------------------------------------------------------------------------------

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **kwargs: Any) -> str:
        """Render `messages` (OpenAI shape). Extra keyword arguments become template variables;
        `chat_template_kwargs` (a dict) is merged in too. `enable_thinking` defaults to True as in
        llama-server; `date_string` defaults to today ("%d %b %Y", what llama.cpp passes)."""
        extra = dict(kwargs)
        ctk = extra.pop("chat_template_kwargs", None) or {}
        extra.update(ctk)
        extra.setdefault("enable_thinking", True)
        extra.setdefault("date_string", datetime.now().strftime("%d %b %Y"))
        msgs = normalize_messages(messages, object_arguments=self.requires_object_arguments)
        ctx: dict[str, Any] = {
            "messages": msgs,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if tools:
            # without tools the variable stays undefined: `{% for tool in tools %}` then renders
            # nothing instead of failing on None (Hermes 3), and `tools is defined` checks work
            ctx["tools"] = tools
        for k, v in extra.items():
            if k not in ("messages", "tools", "add_generation_prompt"):
                ctx[k] = v
        try:
            return self._template.render(**ctx)
        except (jinja2.TemplateError, TypeError):
            if not any(m.get("content") is None for m in msgs):
                raise
        # the template cannot take null content (QwQ splits it): render "" instead, as minja's
        # requires_non_null_content polyfill does
        ctx["messages"] = [dict(m, content="") if m.get("content") is None else m for m in msgs]
        return self._template.render(**ctx)

    def generation_prompt(self, messages: list[dict], tools: list[dict] | None = None,
                          **kwargs: Any) -> str:
        """The text `add_generation_prompt=True` appends (e.g. "<|im_start|>assistant\\n")."""
        with_gp = self.render(messages, True, tools, **kwargs)
        try:
            without = self.render(messages, False, tools, **kwargs)
        except jinja2.TemplateError:
            return ""
        n = 0
        while n < len(with_gp) and n < len(without) and with_gp[n] == without[n]:
            n += 1
        return with_gp[n:]

    # -- capabilities ------------------------------------------------------------------------

    def _try_render(self, messages: list[dict], tools: Any, wrap: bool = True,
                    extra: dict[str, Any] | None = None) -> RenderResult:
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
            text = self._template.render(**ctx)
            return RenderResult(True, text, usage)
        except Exception:  # noqa: BLE001 - any failure means "not supported"
            return RenderResult(False, "", usage)

    @property
    def caps(self) -> dict[str, bool]:
        """llama.cpp's chat_template_caps for this template (keys sorted as the server prints them)."""
        if self._caps is None:
            self._caps = self._detect_caps()
        return dict(self._caps)

    @property
    def requires_object_arguments(self) -> bool:
        """True when the template only renders tool-call arguments given as objects (minja's
        polyfill then parses string arguments)."""
        if self._requires_object_arguments is None:
            needle = {"argument_needle": "print('Hello, World!')"}
            user = {"role": "user", "content": "Hey"}

            def renders(args: Any) -> bool:
                r = self._try_render([user, {"role": "assistant", "content": "",
                                             "tool_calls": [_probe_call("call_1___", args)]}],
                                     None, wrap=False)
                return r.ok and ('"argument_needle":' in r.text or "'argument_needle':" in r.text
                                 or "<parameter=argument_needle>" in r.text)

            str_ok = renders(json.dumps(needle))
            obj_ok = renders(needle)
            self._requires_object_arguments = (not str_ok) and obj_ok
        return self._requires_object_arguments

    def _detect_caps(self) -> dict[str, bool]:
        caps = {
            "supports_tools": True, "supports_tool_calls": True, "supports_system_role": True,
            "supports_parallel_tool_calls": True, "supports_preserve_reasoning": False,
            "supports_string_content": True, "supports_typed_content": False,
            "supports_object_arguments": False, "supports_reasoning_effort": False,
        }
        # typed content: content read as an array
        r = self._try_render([{"role": "user", "content": "content"}], None)
        if ("messages", 0, "content", "[]") in r.usage.used:
            caps["supports_typed_content"] = True
        if not r.ok:
            caps["supports_string_content"] = False
        # system role: is the system message's content read?
        r = self._try_render([{"role": "system", "content": "System message"},
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

        r = self._try_render(one_call({"arg": "value"}), _PROBE_TOOLS)
        if r.ok:
            if ("tools", 0, "function", "name") not in r.usage.used:
                caps["supports_tools"] = False
            if ("messages", 1, "tool_calls") not in r.usage.used:
                caps["supports_tool_calls"] = False
            elif ("messages", 1, "tool_calls", 0, "function", "arguments", "arg") in r.usage.used:
                caps["supports_object_arguments"] = True
        if not caps["supports_object_arguments"]:
            r = self._try_render(one_call(json.dumps({"arg": "value"})), _PROBE_TOOLS)
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
            r = self._try_render(msgs, _PROBE_TOOLS)
            if not r.ok or ("messages", 1, "tool_calls", 1, "function") not in r.usage.used:
                caps["supports_parallel_tool_calls"] = False
        else:
            caps["supports_parallel_tool_calls"] = False
        # preserve reasoning: is reasoning_content deeper in the history printed?
        placeholder = "<REASONING_CONTENT_PLACEHOLDER>"
        r = self._try_render([
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message", "reasoning_content": placeholder},
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
            {"role": "user", "content": "User message"},
        ], [], extra={"enable_thinking": True})
        if placeholder in r.text:
            caps["supports_preserve_reasoning"] = True
        # reasoning effort: does the template read the variable at all?
        caps["supports_reasoning_effort"] = "reasoning_effort" in jinja2.meta.find_undeclared_variables(
            self._env.parse(self.source))
        return {k: caps[k] for k in CAPS_KEYS}

    # -- format ----------------------------------------------------------------------------

    def format(self, has_tools: bool = False, tool_choice: str = "auto",
               has_json_schema: bool = False) -> str:
        return detect_format(self.source, has_tools, tool_choice, has_json_schema)

    @property
    def thinking_tags(self) -> tuple[str, str] | None:
        """(start, end) reasoning tags when the template knows about them."""
        if "<think>" in self.source or "</think>" in self.source:
            return ("<think>", "</think>")
        return None


_FORCED_OPEN_RE = re.compile(r"<think>\s*$")


def thinking_forced_open(generation_prompt: str) -> bool:
    """True when the generation prompt ends inside an open `<think>` block (DeepSeek R1, QwQ)."""
    return bool(_FORCED_OPEN_RE.search(generation_prompt))

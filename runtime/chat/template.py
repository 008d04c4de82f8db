"""Jinja chat templates rendered the way llama-server (`--jinja`) renders them.

`ChatTemplate(source, bos_token, eos_token)` renders OpenAI-style message lists with a sandboxed
Jinja environment configured like Hugging Face's (`trim_blocks`, `lstrip_blocks`, `loopcontrols`,
`raise_exception`, `strftime_now`, HF-style `tojson`). Messages are normalized first as llama.cpp
does (content parts joined, null content, tool-call arguments parsed to objects when the template
needs objects). `caps` reports llama.cpp's `chat_template_caps` (probed in `caps.py`); `format()`
names the chat format llama.cpp's `common_chat_templates_apply` would pick (`formats.py`).
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.chat import caps as _caps
from runtime.chat.continuation import ReasoningMarkers, find_markers
from runtime.chat.formats import ChatFormat, Marker, ToolChoice, detect_format

# The template carried by the Qwen2 vocab GGUF (`tokenizer.chat_template` of
# ggml-vocab-qwen2.gguf): plain ChatML that inserts a default system message.
# (the newlines inside its string literals are real newline characters, as in the GGUF)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# llama.cpp's CHATML_TEMPLATE_SRC (common/chat.cpp): what llama-server b1-0c1e570 uses when the
# model has no template (or `--chat-template chatml`): ChatML without a default system message.
LLAMA_CPP_CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)


def fallback_chatml_template() -> str:
    """The template llama-server b1-0c1e570 falls back to (`LLAMA_CPP_CHATML_TEMPLATE`)."""
    return LLAMA_CPP_CHATML_TEMPLATE


def default_chatml_template() -> str:
    """The ChatML template of the Qwen2 vocab GGUF, for models without a template of their own."""
    return CHATML_TEMPLATE


# ---------------------------------------------------------------------------------------------
# helpers the templates call

def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's tojson: no HTML escaping (unlike Jinja's built-in filter), unicode kept as is
    _caps.touch(x)  # capability probing: serializing a value reads all of it
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _make_env() -> ImmutableSandboxedEnvironment:
    # undefined values chain (messages[0]['role'] of an empty list is undefined, not an error), as
    # llama.cpp's minja: b1 renders Qwen2.5's template for `"messages": []`
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# ---------------------------------------------------------------------------------------------
# message normalization (llama.cpp common_chat_msgs_parse_oaicompat + to_json_oaicompat)

def _content_to_string(content: Any) -> str | None:
    """Content parts joined as llama.cpp joins them: text parts with "\\n" between them, media
    markers (the parts a request's images and audio clips became) without one before or after."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        text, last_marker = "", False
        for part in content:
            if isinstance(part, dict) and part.get("type") == "media_marker":
                text += str(part.get("text", ""))
                last_marker = True
                continue
            if isinstance(part, dict) and part.get("type") == "text":
                s = str(part.get("text", ""))
            elif isinstance(part, str):
                s = part
            else:
                continue
            if not last_marker and text:
                text += "\n"
            text += s
            last_marker = False
        return text
    return str(content)


def _typed_parts(content: Any) -> list[dict]:
    """Content as b1's to_json_oaicompat writes typed content: text and media-marker parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": p["type"], "text": str(p.get("text", ""))} for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "media_marker")]


def normalize_messages(messages: list[dict], object_arguments: bool = True, string_content: bool = True,
                       typed_content: bool = False) -> list[dict]:
    """Copies of `messages` as the template sees them.

    content (b1's messages_inp_normalizer from the template's caps): a template that reads only
    strings gets the parts joined with "\\n"; one that reads only typed parts gets a string as one
    text part; one that reads both gets the content as it came. Null is kept as None for assistant
    messages with tool calls, "" otherwise. tool_calls[].function.arguments: a JSON string is parsed
    to an object when `object_arguments` (templates that `| tojson` it need the object).
    """
    only_typed = typed_content and not string_content
    keep_parts = typed_content and string_content
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object")
        msg = dict(m)
        if "role" not in msg:
            raise ValueError("message is missing 'role'")
        raw = msg.get("content")
        if isinstance(raw, list) and keep_parts:
            content = _typed_parts(raw)
        elif only_typed and raw is not None:
            content = _typed_parts(_content_to_string(raw))
        else:
            content = _content_to_string(raw)
        if content is None and not msg.get("tool_calls"):
            content = [] if only_typed else ""
        msg["content"] = content
        if msg.get("tool_calls"):
            calls = []
            if not isinstance(msg["tool_calls"], list):
                raise ValueError("'tool_calls' must be an array of tool call objects")
            for tc in msg["tool_calls"]:
                if not isinstance(tc, dict) or not isinstance(tc.get("function", {}), dict):
                    raise ValueError("each entry of 'tool_calls' must be an object with a 'function' object "
                                     "({\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}})")
                tc = dict(tc)
                fn = dict(tc.get("function") or {})
                if "name" in fn and not isinstance(fn["name"], str):
                    raise ValueError("a tool call's 'function.name' must be a string")
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


def message_workarounds(messages: list[dict], source: str, supports_system_role: bool) -> list[dict]:
    """b1-0c1e570's common_chat_templates_apply_jinja workarounds on the messages before rendering:
    a "developer" message becomes "system" unless the template is harmony's (`<|channel|>`), and a
    template that does not read a system message gets the first one merged into the next message
    ("SYSTEM\nNEXT"), or dropped when it is the only message."""
    msgs = [dict(m) if isinstance(m, dict) else m for m in messages]
    if "<|channel|>" not in source:
        for m in msgs:
            if isinstance(m, dict) and m.get("role") == "developer":
                m["role"] = "system"
    if not supports_system_role and msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
        first = msgs.pop(0)
        if msgs and isinstance(msgs[0], dict):
            head = _content_to_string(first.get("content")) or ""
            msgs[0]["content"] = head + "\n" + (_content_to_string(msgs[0].get("content")) or "")
    return msgs


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
        self._reasoning_markers: ReasoningMarkers | None = None

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
        # b1-0c1e570 (common_chat_templates_apply_jinja): string arguments are parsed into objects
        # for templates whose caps say supports_object_arguments (workaround::func_args_not_string)
        caps = self.caps
        msgs = normalize_messages(messages, object_arguments=self.requires_object_arguments
                                  or caps["supports_object_arguments"], string_content=caps["supports_string_content"],
                                  typed_content=caps["supports_typed_content"])
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
            return self._template.render(ctx)  # a dict: a variable named "self" is no argument
        except (jinja2.TemplateError, TypeError):
            if not any(m.get("content") is None for m in msgs):
                raise
        # the template cannot take null content (QwQ splits it): render "" instead, as minja's
        # requires_non_null_content polyfill does
        ctx["messages"] = [dict(m, content="") if m.get("content") is None else m for m in msgs]
        return self._template.render(ctx)

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

    @property
    def caps(self) -> dict[str, bool]:
        """llama.cpp's chat_template_caps for this template (keys sorted as the server prints them)."""
        if self._caps is None:
            self._caps = _caps.detect_caps(self._template, self._env, self.source)
        return dict(self._caps)

    @property
    def reasoning_markers(self) -> ReasoningMarkers:
        """The reasoning start / end markers b1's differential analysis finds in this template
        (runtime/chat/continuation.py), computed once."""
        if self._reasoning_markers is None:
            def render(messages, add_generation_prompt, enable_thinking):
                return self.render(messages, add_generation_prompt, chat_template_kwargs={"enable_thinking": enable_thinking})
            self._reasoning_markers = find_markers(render, self.source)
        return self._reasoning_markers

    @property
    def requires_object_arguments(self) -> bool:
        """True when the template only renders tool-call arguments given as objects (minja's
        polyfill then parses string arguments)."""
        if self._requires_object_arguments is None:
            self._requires_object_arguments = _caps.requires_object_arguments(self._template)
        return self._requires_object_arguments

    # -- format ----------------------------------------------------------------------------

    def format(self, has_tools: bool = False, tool_choice: str = ToolChoice.AUTO,
               has_json_schema: bool = False, jinja: bool = True) -> ChatFormat:
        return detect_format(self.source, has_tools, tool_choice, has_json_schema, jinja)

    @property
    def thinking_tags(self) -> tuple[str, str] | None:
        """(start, end) reasoning tags when the template knows about them."""
        if Marker.THINK_START in self.source or Marker.THINK_END in self.source:
            return (Marker.THINK_START, Marker.THINK_END)
        if "'<|tool_call>call:'" in self.source:  # b1's gemma4 format (chat.cpp's detection): supports_thinking
            return (Marker.GEMMA4_THOUGHT, Marker.GEMMA4_CHANNEL_END)
        return None

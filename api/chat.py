"""OpenAI chat requests: messages -> prompt (`oaicompat_chat_params_parse`), and the model's text
-> an assistant message with `content`, `reasoning_content` and `tool_calls`, whole or as deltas.

A final assistant message is a prefill: the conversation before it is rendered and b1's continuation
(the generation prompt, the message's reasoning in the template's markers, its content) is appended,
so the model continues it (lesson Example 13; runtime/chat/continuation.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.chat_checks import check_message_shapes, parse_messages, parse_tools
from api.chat_kwargs import request_kwargs, template_variables
from api.errors import ApiError
from api.params import CHAT_PARSER_FAILED, Fields, schema_to_grammar_or_400
from runtime.serving.failures import describe
from runtime.chat.continuation import Continuation, continuation_tail, resolve_mode
from runtime.chat.harmony import HarmonyMismatch, is_harmony_template, template_messages
from runtime.chat import (
    REASONING_FORMATS,
    ChatFormat,
    StreamingChatParser,
    ToolGrammarError,
    parse_chat_output,
    json_response_grammar,
    message_workarounds,
    thinking_forced_open,
    tool_grammar_for,
)


def template_source(tmpl: Any) -> str:
    return getattr(tmpl, "source", "") or ""


def template_caps(tmpl: Any) -> dict[str, bool]:
    return dict(getattr(tmpl, "caps", {}) or {})


def special_text(tok: Any, tid: int | None) -> str:
    if tid is None or tid < 0:
        return ""
    return tok.piece(tid).decode("utf-8", "replace")


PEG_SPACE = " \t\n\v\f\r"  # what llama.cpp's PEG parsers skip between parts (std::isspace)

# user messages (the last ones) whose token positions a chat task carries (chat_task.user_starts)
USER_STARTS_MAX = 8

@dataclass
class ChatPrep:
    """A chat request after template rendering."""
    body: dict[str, Any]  # the request with OpenAI names mapped to native ones (n_predict, n_probs, ...)
    prompt: str
    chat_format: str
    reasoning_format: str
    prefill: str = ""  # content of a final assistant message, continued by the model
    think_prefix: str = ""  # an open "<think>" the generation prompt already wrote
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    include_usage: bool = False
    # the format b1-0c1e570 names in generation_settings: every Jinja template goes through its
    # generated ("autoparser") PEG parser, the legacy --no-jinja route parses nothing
    echo_format: str = ChatFormat.CONTENT_ONLY
    grammar_prefix: str = ""  # generated text the tool grammar has already seen (the prefill), set by apply_grammar
    generation_prompt: str = ""  # the template's assistant-turn opening + the prefill (b1's generation_prompt)
    # the rendered conversation before each of the last user messages (their token positions are
    # where llama-server's context checkpoints may end a prompt batch: chat_task.user_starts)
    user_prefixes: list[str] = field(default_factory=list)
    files: list[bytes] = field(default_factory=list)  # the media parts' files, one per media marker in `prompt`
    media: list[Any] = field(default_factory=list)  # their chunks once tokenized (CompletionTask.media)
    part_starts: list[int] = field(default_factory=list)  # where the prompt's text after each marker begins
    # --skip-chat-parsing: everything the model writes is content (b1's pure content parser)
    content_only: bool = False
    reasoning_prefix: str = ""  # a continued message's reasoning (b1: its markers, its text), parsed before the prefill
    think_space: tuple[str, str] | None = None  # whitespace b1's parser allows after <think> and </think>


def _int_or(v: Any, default: int) -> int:
    """nlohmann's json_value for an int: the default when the value is not a number."""
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def reasoning_fields(cfg: Any, body: dict[str, Any], tags: tuple[str, str]) -> dict[str, Any]:
    """The budget fields b1 passes a chat request that has reasoning tags: its budget (its own,
    thinking_budget_tokens, else --reasoning-budget), the tags, the message, reasoning_control."""
    budget = _int_or(body.get("reasoning_budget_tokens"), _int_or(body.get("thinking_budget_tokens"), -1))
    if budget == -1:
        budget = cfg.reasoning_budget
    msg = body.get("reasoning_budget_message")
    control = body.get("reasoning_control")
    return {"reasoning_budget_tokens": budget, "reasoning_budget_start_tag": tags[0],
            "reasoning_budget_end_tags": [tags[1]],
            "reasoning_budget_message": msg if isinstance(msg, str) else cfg.reasoning_budget_message,
            "reasoning_control": control if isinstance(control, bool) else False}


def _tool_choice(raw: Any) -> str:
    """b1-0c1e570 reads `tool_choice` as a string (json_value): any other JSON value, an object naming
    one function included, is its default "auto"; a string must be auto, none or required."""
    if not isinstance(raw, str):
        return "auto"
    if raw not in ("auto", "none", "required"):
        raise ApiError(f"Invalid tool_choice: {raw}")
    return raw


def _continuation(raw: Any) -> str | None:
    """`continue_final_message` (common_chat_continuation_parse): true, "content" or
    "reasoning_content" continue the final message; anything else does not."""
    if raw is True:
        return "auto"
    if raw in ("content", "reasoning_content"):
        return raw
    return None


def prepare(server: Any, body: dict[str, Any]) -> ChatPrep:
    cfg = server.cfg
    tmpl = server.engine.chat_template
    f = Fields(body)
    messages = body.get("messages")
    if messages is None:
        raise ApiError("'messages' is required")
    if not isinstance(messages, list):
        raise ApiError("Expected 'messages' to be an array")
    # b1's checks, its messages and statuses (api/chat_checks.py); with --mmproj the media parts'
    # files are loaded and the parts become media markers
    messages, files = check_message_shapes(messages, media_options(server))
    parse_messages(messages)
    parse_tools(body.get("tools"))
    continuation = _continuation(body.get("continue_final_message"))
    add_generation_prompt = f.boolean("add_generation_prompt", True)
    last_is_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    if continuation is None and last_is_assistant and cfg.prefill_assistant:  # --no-prefill-assistant: not
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise ApiError("Cannot have 2 or more assistant messages at the end of the list.")
        continuation, add_generation_prompt = "auto", False
    if continuation is not None and add_generation_prompt:
        raise ApiError("Cannot set both add_generation_prompt and continue_final_message to true.")
    if continuation is not None and last_is_assistant and messages[-1].get("tool_calls"):
        raise ApiError("Cannot continue an assistant message that contains tool calls.")
    tools = body.get("tools") or []
    if tools and cfg.jinja:  # b1's generated parser converts each tool's parameters: its checks, its 400
        from grammar import GrammarError
        from grammar.json_schema_check import check_json_schema
        for t in tools:
            try:
                check_json_schema(t["function"].get("parameters", {}))
            except GrammarError as e:
                raise ApiError(CHAT_PARSER_FAILED + str(e)) from None
    tool_choice = _tool_choice(body.get("tool_choice"))
    if tools and not cfg.jinja:
        raise ApiError("tools param requires --jinja flag")
    if tool_choice != "auto" and not cfg.jinja:
        raise ApiError("tool_choice param requires --jinja flag")
    out = dict(body)

    # OpenAI names -> native ones (the token limit's names stay: parse_task reads them as b1 does)
    if f.boolean("logprobs", False):
        if tools and f.boolean("stream", False):
            raise ApiError("logprobs is not supported with tools + stream")
        out["n_probs"] = f.integer("top_logprobs", 20)
    elif f.has("top_logprobs"):
        raise ApiError("top_logprobs requires logprobs to be set to true")
    # --skip-chat-parsing (b1's force_pure_content_parser): the prompt is rendered as usual, the output
    # is all content: no reasoning or tool-call parsing, no tool grammar, no response_format grammar
    content_only = bool(getattr(cfg, "skip_chat_parsing", False)) and cfg.jinja
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise ApiError("response_format must be an object")
        kind = rf.get("type")
        if kind == "json_object":
            schema = rf.get("schema", {"type": "object"})
        elif kind == "json_schema":
            js = rf.get("json_schema") or {}
            schema = js.get("schema", {"type": "object"}) if isinstance(js, dict) else {"type": "object"}
        elif kind != "text":
            raise ApiError(f'response_format type must be one of "text" or "json_object", but got: {kind}')
        if kind in ("json_object", "json_schema") and not content_only:
            out["json_schema"] = schema
    stream_options = body.get("stream_options")
    # a field of b1's schema: an object's include_usage must be a boolean (or null)
    include_usage = isinstance(stream_options, dict) and Fields(stream_options).boolean("include_usage", False)

    # render
    msgs = list(messages)
    if cfg.jinja and is_harmony_template(tmpl.source):  # gpt-oss: reasoning_content as "thinking"
        msgs = template_messages(msgs)
    prefill = ""
    cont_mode = None  # continuing the final assistant message (b1's continue_msg)
    if continuation is not None and msgs and msgs[-1].get("role") == "assistant" and not msgs[-1].get("tool_calls"):
        content = msgs[-1].get("content")
        if isinstance(content, list):  # text parts, joined as the template joins them (Responses items)
            content = "\n".join(str(p.get("text", "")) for p in content
                                 if isinstance(p, dict) and p.get("type") == "text")
        prefill = content if isinstance(content, str) else ""
        cont_reasoning = messages[-1].get("reasoning_content")
        cont_reasoning = cont_reasoning if isinstance(cont_reasoning, str) else ""
        cont_mode = resolve_mode(continuation, {"content": prefill, "reasoning_content": cont_reasoning})
        msgs = msgs[:-1]
        # --no-jinja: the turn before it is opened, then its content follows; with a template, b1 renders
        # the messages without the generation prompt and appends its continuation (runtime/chat/continuation.py)
        add_generation_prompt = not cfg.jinja
    if cfg.jinja:  # b1's workarounds: developer -> system; no system role: merged into the next message
        msgs = message_workarounds(msgs, tmpl.source, template_caps(tmpl).get("supports_system_role", True))
    # the server's kwargs (--chat-template-kwargs, --reasoning*, ...) and the request's (api/chat_kwargs.py)
    kwargs, enable_thinking = request_kwargs(cfg, tmpl, body)
    if "add_generation_prompt" in kwargs:  # llama.cpp's extra_context overrides the template's variable
        add_generation_prompt = bool(kwargs.pop("add_generation_prompt"))  # jinja truthiness
    kwargs = template_variables(kwargs, enable_thinking)
    # the template sees each tool as llama-server re-serializes it (common_chat_tools_to_json_oaicompat):
    # name, description, parameters only (a Responses tool's "strict" is not printed)
    fns = [t.get("function") if isinstance(t, dict) else None for t in tools]
    shown = [{"type": "function", "function": {"name": fn.get("name"), "description": fn.get("description", ""),
                                               "parameters": fn.get("parameters", {})}}
             if isinstance(fn, dict) else t for t, fn in zip(tools, fns)] or None
    try:
        # the request's names as template variables only (a key such as "self" or "tools" is no argument)
        prompt = tmpl.render(msgs, add_generation_prompt=add_generation_prompt, tools=shown,
                             chat_template_kwargs=kwargs)
        gen_prompt = tmpl.generation_prompt(msgs, tools=shown, chat_template_kwargs=kwargs) if msgs else ""
    except ApiError:
        raise
    except Exception as e:  # jinja errors, raise_exception() in the template
        raise ApiError(f"Failed to apply chat template: {describe(e)}") from e
    reasoning_prefix = ""  # the continued message's reasoning part, before the prefill (the parser reads both)
    if cont_mode is not None and cfg.jinja:
        tail, own = continuation_tail(tmpl.source, tmpl.reasoning_markers, gen_prompt, prefill, cont_reasoning,
                                      cont_mode, prompt)
        if cont_mode is Continuation.REASONING:
            prefill = ""
        reasoning_prefix = own[:len(own) - len(prefill)]
        gen_prompt = tail[:len(tail) - len(own)]
        prompt += tail[:len(tail) - len(prefill)]
    prompt += prefill
    user_prefixes = []
    for i in [i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "user"][-USER_STARTS_MAX:]:
        try:
            user_prefixes.append(tmpl.render(msgs[:i], add_generation_prompt=False, tools=shown,
                                             chat_template_kwargs=kwargs))
        except Exception:  # a template that cannot render that prefix: no position for it
            continue

    reasoning_format = f.string("reasoning_format", cfg.reasoning_format)
    if reasoning_format not in REASONING_FORMATS:
        raise ApiError(f"Unknown reasoning format: {reasoning_format}")
    think_prefix = ""
    if thinking_forced_open(gen_prompt):  # the generation prompt ends inside "<think>": the model continues it
        think_prefix = gen_prompt[gen_prompt.rfind("<think>"):]
    if reasoning_prefix:  # the continuation wrote its own reasoning opening (closed, or open to continue)
        think_prefix = ""
    think_space = None  # b1's optspace around the template's own <think> / </think> markers
    if cfg.jinja and not content_only:
        mk = tmpl.reasoning_markers
        if mk.start.strip(PEG_SPACE) == "<think>" and mk.end.strip(PEG_SPACE) == "</think>":
            think_space = (mk.start[len(mk.start.rstrip(PEG_SPACE)):], mk.end[len(mk.end.rstrip(PEG_SPACE)):])
    # b1-0c1e570 ignores the tools of a template that cannot render tool calls (its generated
    # parser has no tool syntax to read: no grammar, the output is content)
    caps = template_caps(tmpl)
    if tools and not caps.get("supports_tool_calls", True) or content_only:
        tools = []
    if content_only:
        think_prefix = ""
    chat_format = tmpl.format(bool(tools), tool_choice, "json_schema" in out, jinja=cfg.jinja)
    grammar_prefix = ""
    if chat_format == ChatFormat.PEG_NATIVE and out.get("json_schema") is not None and not body.get("grammar") \
            and not content_only:
        # b1-0c1e570: the schema's JSON, bare or in a ```json fence (the content is the JSON alone),
        # the grammar primed with a prefilled assistant turn (the JSON may have begun there)
        out["grammar"] = schema_to_grammar_or_400(out.pop("json_schema"), json_response_grammar, chat=True)
        grammar_prefix = prefill
    tags = getattr(tmpl, "thinking_tags", None) if cfg.jinja and not content_only else None
    if tags:  # the template's reasoning tags: the budget sampler (runtime/sampling/reasoning_budget.py)
        out.update(reasoning_fields(cfg, body, tags))
    return ChatPrep(out, prompt, chat_format, reasoning_format, prefill, think_prefix, tools, tool_choice,
                    # b1-0c1e570's default: whether the template can render several calls
                    f.boolean("parallel_tool_calls", caps.get("supports_parallel_tool_calls", False)),
                    include_usage, (chat_format if chat_format == ChatFormat.GEMMA4 else ChatFormat.PEG_NATIVE)
                    if cfg.jinja else ChatFormat.CONTENT_ONLY, grammar_prefix,
                    gen_prompt + reasoning_prefix + prefill, user_prefixes, files, content_only=content_only,
                    reasoning_prefix=reasoning_prefix, think_space=think_space)


def media_options(server: Any) -> dict[str, Any] | None:
    """What a chat request's media parts need (api/media.py), or None without --mmproj."""
    mods = getattr(server.engine, "modalities", None) or {}
    if not any(mods.values()):
        return None
    return {"modalities": mods, "media_path": getattr(server.cfg, "media_path", ""), "marker": server.media_marker}


# ------------------------------------------------------------------------------------------
# grammars for tool calls

def apply_grammar(server: Any, prep: ChatPrep, params: Any) -> None:
    """Constrain a chat request with tools (`runtime.chat.tool_grammar_for`): `tool_choice: required`
    forces a tool call (after optional free text, as llama-server); `auto` adds the format's grammar
    lazily, active once the model writes its trigger word (e.g. `<tool_call>`), so free text stays
    possible before it."""
    if not params.grammar:
        try:
            tg = tool_grammar_for(prep.tools, prep.chat_format, prep.tool_choice, prep.parallel_tool_calls,
                                  prep.prefill, thinking_forced_open=bool(prep.think_prefix))
        except ToolGrammarError as e:
            raise ApiError(str(e)) from e
        if tg is not None:
            params.grammar, prep.grammar_prefix = tg.grammar, tg.prefix
            if tg.lazy is not None:
                params.grammar_lazy, params.grammar_triggers = tg.lazy, list(tg.triggers)
    if params.grammar:
        from grammar import SAMPLER_INIT_FAILED, GrammarError, GrammarTooLarge, parse_gbnf
        try:
            parse_gbnf(params.grammar)
        except GrammarTooLarge as e:
            raise ApiError(str(e)) from e
        except GrammarError as e:
            raise ApiError(SAMPLER_INIT_FAILED) from e


# ------------------------------------------------------------------------------------------
# output parsing (runtime.chat)

class ChatOutput:
    """Generated text -> OpenAI deltas while streaming, and the final assistant message."""

    def __init__(self, prep: ChatPrep):
        self.prep = prep
        self.parse_tools = bool(prep.tools) and prep.tool_choice != "none"
        # --skip-chat-parsing: no reasoning split either
        self.format = ChatFormat.CONTENT_ONLY if prep.content_only else prep.chat_format
        self.reasoning_format = "none" if prep.content_only else prep.reasoning_format
        self.stream = StreamingChatParser(self.format, self.reasoning_format, bool(prep.think_prefix),
                                          self.parse_tools, "" if prep.content_only else prep.think_prefix + prep.reasoning_prefix + prep.prefill,
                                          prep.think_space)
        self.has_tool_calls = False
        self._leading = prep.content_only  # the pure content parser skips the whitespace the text starts with

    def add(self, text: str) -> list[dict[str, Any]]:
        if self._leading:
            text = text.lstrip(PEG_SPACE)
            if not text:
                return []
            self._leading = False
        deltas = self.stream.feed(text)
        self.has_tool_calls |= any("tool_calls" in d for d in deltas)
        return deltas

    def finish(self) -> list[dict[str, Any]]:
        try:
            deltas, msg = self.stream.finish()
        except HarmonyMismatch as e:  # b1: the request fails with a 500 (an error event once streaming)
            raise ApiError(str(e), "server_error", 500) from None
        self.has_tool_calls |= bool(msg.tool_calls)
        return deltas

    def final_message(self, content: str) -> dict[str, Any]:
        if self.prep.content_only:  # b1's pure content parser: literal(generation_prompt) << content(rest)
            return {"role": "assistant", "content": content.lstrip(PEG_SPACE)}
        try:
            msg = parse_chat_output(content, self.format, self.reasoning_format,
                                    bool(self.prep.think_prefix), self.parse_tools,
                                    self.prep.think_prefix + self.prep.reasoning_prefix + self.prep.prefill,
                                    think_space=self.prep.think_space)
        except HarmonyMismatch as e:
            raise ApiError(str(e), "server_error", 500) from None
        self.has_tool_calls = bool(msg.tool_calls)
        return msg.to_openai()

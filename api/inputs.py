"""Request bodies and prompts -> plain data: the JSON body, prompt token ids, the context check.

Shared by the route families (native, OpenAI, tokens, embeddings); every failure is an ApiError
with llama-server's message.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from fastapi import Request

from api import strict_json
from api.engine_api import TokenizerAPI
from api.errors import ApiError, context_exceeded, json_type_name

MAX_TASKS_PER_REQUEST = 4096  # prompts x n (or embedding inputs) one request may start (llama-server: none)
OFF_LOOP_BYTES = 256 << 10  # bodies (and prompts) larger than this are parsed / tokenized in a worker thread


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, parsed as strictly as llama-server (api/strict_json.py):
    a parse error is its 500 server_error. A large body is parsed off the event loop."""
    raw = await request.body()
    if not raw.strip():
        return {}
    data = await asyncio.to_thread(strict_json.loads, raw) if len(raw) > OFF_LOOP_BYTES else strict_json.loads(raw)
    if not isinstance(data, dict):
        raise ApiError(f"[json.exception.type_error.302] type must be object, but is {json_type_name(data)}",
                       "invalid_request_error", 400)
    return data


async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run CPU-heavy request work (tokenizing a prompt) in a worker thread: the event loop keeps
    serving other requests (/health answers while a 50 MB prompt is tokenized)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


ELEMENTS_ERROR = ('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, '
                  'or a list of mixed strings & tokens.')


def is_int(v: Any) -> bool:
    """is_number_integer(): a JSON integer (1.0 is a float)."""
    return isinstance(v, int) and not isinstance(v, bool)


def as_token(v: Any, status: int = 400) -> int:
    """`get<llama_token>()` of one element: an int32 (wrapped), a float truncated, true / false as
    1 / 0 (nlohmann converts booleans to numbers), else its type_error."""
    if not isinstance(v, (int, float)):
        kind = ("invalid_request_error", 400) if status == 400 else ("server_error", 500)
        raise ApiError(f"[json.exception.type_error.302] type must be number, but is {json_type_name(v)}", *kind)
    return ((int(v) + (1 << 31)) % (1 << 32)) - (1 << 31)


def tokenize_mixed(tok: TokenizerAPI, prompt: Any, add_special: bool, parse_special: bool = True,
                   status: int = 400) -> list[int]:
    """llama-server's tokenize_mixed: a string, or a list of strings and token ids (add_special for a
    first element that is a string). Other element types: its type_error (`status` 400 where the
    route reports a bad prompt as invalid_request_error, 500 where it is a server_error)."""
    if isinstance(prompt, list):
        out: list[int] = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                out.extend(tok.encode(p, add_special=add_special and i == 0, parse_special=parse_special))
            else:
                out.append(as_token(p, status))
        return out
    if not isinstance(prompt, str):
        kind = ("invalid_request_error", 400) if status == 400 else ("server_error", 500)
        raise ApiError(f"[json.exception.type_error.302] type must be string, but is {json_type_name(prompt)}", *kind)
    return list(tok.encode(prompt, add_special=add_special, parse_special=parse_special))


INVALID_TOKENS = "Prompt contains invalid tokens"


def tokenize_prompt(tok: TokenizerAPI, prompt: Any) -> list[int]:
    """One prompt of /completion (llama-server's tokenize_input_subprompt): a string or a list mixing
    strings and ids (`tokenize_mixed`), a list of ids, or an object `{"prompt_string": ...}` (with
    `multimodal_data`: refused, no multimodal model here); ids outside the vocabulary are refused
    as b1 refuses them when the task starts ("Prompt contains invalid tokens")."""
    mixed = isinstance(prompt, list) and any(isinstance(p, str) for p in prompt) and any(is_int(p) for p in prompt)
    if isinstance(prompt, str) or mixed:
        toks = tokenize_mixed(tok, prompt, True)
    elif isinstance(prompt, list) and all(is_int(p) for p in prompt):
        toks = [as_token(p) for p in prompt]
    elif isinstance(prompt, dict) and "prompt_string" in prompt:
        if "multimodal_data" in prompt:
            raise ApiError("Multimodal data provided, but model does not support multimodal requests.")
        toks = tokenize_mixed(tok, prompt["prompt_string"], True)
    else:
        raise ApiError(ELEMENTS_ERROR)
    if any(not 0 <= t < tok.n_vocab for t in toks):
        raise ApiError(INVALID_TOKENS)
    return toks


async def prompt_with_media(ctx: Any, prompt: Any) -> tuple[list[int], list[Any]]:
    """One prompt of /completion or /v1/completions: its token ids and media chunks. A prompt object
    with `multimodal_data` (base64 files, one per media marker in its `prompt_string`) on a server
    with --mmproj is tokenized by the runtime (`engine.tokenize_media`); any other, `tokenize_prompt`."""
    mods = getattr(ctx.engine, "modalities", None) or {}
    if isinstance(prompt, dict) and "prompt_string" in prompt and "multimodal_data" in prompt and any(mods.values()):
        from api.chat_task import media_prompt
        from api.media import base64_decode

        data, text = prompt["multimodal_data"], prompt["prompt_string"]
        entries = data if isinstance(data, list) else [] if data is None else [data]
        for v in [*entries, text]:
            if not isinstance(v, str):
                raise ApiError(f"[json.exception.type_error.302] type must be string, but is {json_type_name(v)}")
        mp = await media_prompt(ctx, text, [base64_decode(v) for v in entries])
        return list(mp.tokens), list(mp.chunks)
    return await off_loop(tokenize_prompt, ctx.tokenizer, prompt), []


def text_tokens(toks: list[int]) -> list[int]:
    """A prompt's token ids without its media rows (negative ids): what llama-server detokenizes."""
    return [t for t in toks if t >= 0]


def split_prompts(prompt: Any) -> list[Any]:
    """A `prompt` field -> its prompts: a list without integers (strings, token lists, prompt
    objects) holds one prompt per element (llama-server's tokenize_input_prompts)."""
    if isinstance(prompt, list) and not any(is_int(p) for p in prompt):
        if not prompt:
            raise ApiError('"prompt" must not be empty')
        return list(prompt)
    return [prompt]


def check_context(n_tokens: int, n_ctx_slot: int) -> None:
    """A prompt must leave room in its slot: llama-server's exceed_context_size_error otherwise."""
    if n_tokens >= n_ctx_slot:
        raise context_exceeded(n_tokens, n_ctx_slot)




def check_task_count(n_tasks: int) -> None:
    """A request starts at most MAX_TASKS_PER_REQUEST tasks: a body of a few MB can list millions of
    one-token prompts, each a task in the engine's queue (tritium's bound, a 400 naming it)."""
    if n_tasks > MAX_TASKS_PER_REQUEST:
        raise ApiError(f"too many tasks in one request: {n_tasks} (prompts x n, or inputs); the limit is "
                       f"{MAX_TASKS_PER_REQUEST}")

"""A chat-completions request body -> a CompletionTask: for `/v1/chat/completions`, for the routes
that convert their own API into a chat request first (Responses, Anthropic Messages) and for the
token-counting routes (llama-server's `oaicompat_chat_params_parse` + `handle_completions_impl` /
`handle_count_tokens`). The prompt is tokenized and the grammar compiled off the event loop.
"""
from __future__ import annotations

from typing import Any

from api import chat as chat_api
from api.context import ApiContext
from api.errors import ApiError
from api.inputs import check_context, off_loop
from api.params import parse_sampling, parse_task
from runtime.tasks import CompletionTask, SamplingParams


async def prompt_tokens(ctx: ApiContext, body: dict[str, Any]) -> tuple[chat_api.ChatPrep, list[int]]:
    prep = await off_loop(chat_api.prepare, ctx, body)  # renders the template: 100k messages take seconds
    if prep.files:  # images / audio: the runtime decodes and tokenizes them (mtmd_tokenize)
        mp = await media_prompt(ctx, prep.prompt, prep.files)
        prep.media, prep.part_starts = mp.chunks, mp.part_starts
        return prep, list(mp.tokens)
    return prep, list(await off_loop(ctx.tokenizer.encode, prep.prompt, add_special=True, parse_special=True))


async def media_prompt(ctx: ApiContext, prompt: str, files: list[bytes]) -> Any:
    """`engine.tokenize_media` off the event loop; a file that is no usable media, or markers that do
    not match the files, are llama-server's 400s ("Failed to load image or audio file", "Failed to
    tokenize prompt"; the reason goes to the log)."""
    from runtime.vision import MediaError

    try:
        return await off_loop(ctx.engine.tokenize_media, prompt, files, ctx.media_marker)
    except MediaError as e:
        ctx.log.srv("W", "process_mtmd_prompt", str(e))
        raise ApiError(e.public) from None


async def chat_task(ctx: ApiContext, body: dict[str, Any]) -> tuple[chat_api.ChatPrep, CompletionTask, SamplingParams]:
    """The task a `/v1/chat/completions` request with this body runs."""
    cfg = ctx.cfg
    prep, toks = await prompt_tokens(ctx, body)
    check_context(len(toks), ctx.engine.n_ctx_slot)
    params = await off_loop(parse_sampling, prep.body, cfg.defaults, ctx.tokenizer, ctx.engine.n_ctx_slot)
    await off_loop(chat_api.apply_grammar, ctx, prep, params)  # parses the grammar
    task = parse_task(prep.body, toks, params, cfg.n_predict, openai=True, defaults=cfg.request_defaults)
    task.media = list(prep.media)
    task.chat_format, task.grammar_prefix = prep.echo_format, prep.grammar_prefix
    task.generation_prompt = prep.generation_prompt
    task.user_starts = await off_loop(user_starts, ctx, prep, toks)
    return prep, task, params


def user_starts(ctx: ApiContext, prep: chat_api.ChatPrep, toks: list[int]) -> list[int]:
    """The token positions where the last user messages begin (llama-server finds them by its
    template's user delimiter, `common_chat_msg_delimiters::split`, and ends prompt batches and
    saves context checkpoints there on sliding-window models): the length of the rendered
    conversation before each, where its tokens are a prefix of the prompt's (past media, those of
    its text after the last marker, from where that text begins in the prompt)."""
    out = []
    for text in prep.user_prefixes:
        k = text.count(ctx.media_marker) if prep.media else 0
        if k >= len(prep.part_starts) > 0:
            continue
        if k:
            at = prep.part_starts[k]
            pre = ctx.tokenizer.encode(text.rsplit(ctx.media_marker, 1)[1], add_special=False, parse_special=True)
        else:
            at, pre = 0, ctx.tokenizer.encode(text, add_special=True, parse_special=True)
        if 0 < at + len(pre) < len(toks) and toks[at:at + len(pre)] == pre:
            out.append(at + len(pre))
    return sorted(set(out))

"""The OpenAI-compatible generation routes: `/v1/completions` and `/v1/chat/completions` (alias
`/chat/completions`), whole or streamed (`chat.completion.chunk` / `text_completion` chunks, then
`data: [DONE]`). Chat messages become a prompt and the output an assistant message in api/chat.py.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api import chat as chat_api
from api.chat_task import chat_task
from api.choices import n_choices, with_children
from api.context import BUILD_INFO, ApiContext, Ctx, random_id
from api.errors import ApiError, answer
from api.inputs import (check_context, check_task_count, off_loop, prompt_with_media, read_json, split_prompts,
                        text_tokens)
from api.params import Fields, parse_sampling, parse_task, reasoning_format_name, sampling_settings
from api.results import (NativeRequest, collect_all, completion_final_json, finish_reason, partial_json, probs_json,
                         usage_json, with_progress)
from api.sse import Stream, stream_many
from runtime.tasks import CompletionResult, CompletionTask, PromptProgress, TokenOut

router = APIRouter()


@router.post("/v1/completions")
async def oai_completion(ctx: Ctx, request: Request) -> Response:
    cfg = ctx.cfg
    body = await read_json(request)
    if "prompt" not in body:
        raise ApiError("[json.exception.out_of_range.403] key 'prompt' not found")
    n = n_choices(body, ctx.engine.n_slots)
    body = dict(body)
    if body.get("logprobs") is not None:  # OpenAI: logprobs is the number of top candidates
        body["n_probs"] = Fields(body).integer("logprobs", 0)
    tasks: list[CompletionTask] = []
    leads: list[bytes] = []  # streamed: b1's `data: null` for each further prompt (see routes/native.py)
    params = None
    prompts = split_prompts(body["prompt"])
    check_task_count(len(prompts) * n)
    for i, p in enumerate(prompts):  # each prompt, then its n - 1 children
        toks, media = await prompt_with_media(ctx, p)
        check_context(len(toks), ctx.engine.n_ctx_slot)
        if params is None:  # the same for every prompt: parsed (and its grammar compiled) once
            params = await off_loop(parse_sampling, body, cfg.defaults, ctx.tokenizer, ctx.engine.n_ctx_slot)
        task = parse_task(body, toks, params, cfg.n_predict, openai=True, defaults=cfg.request_defaults)
        task.media = media
        tasks.extend(with_children(task, n))
        leads.extend([b"data: null\n\n" if i > 0 else b""] + [b""] * (n - 1))
    cmpl_id = "chatcmpl-" + random_id()
    model = cfg.model_name
    verbose = Fields(body).boolean("verbose", cfg.verbose)

    def base(choice: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [choice], "created": int(time.time()), "model": model,
                "system_fingerprint": BUILD_INFO, "object": "text_completion", "id": cmpl_id}

    if not tasks[0].stream:  # b1: the tasks' choices in one object, the first task's usage and timings
        outs = await collect_all(request, [ctx.engine.submit(t) for t in tasks])
        choices = []
        for i, (toks_out, res) in enumerate(outs):
            logprobs = None
            if params.n_probs > 0:
                logprobs = {"content": probs_json(ctx.tokenizer, toks_out or res.probs, False)}
            choices.append({"text": res.content, "index": i, "logprobs": logprobs, "finish_reason": finish_reason(res)})
        toks_out, res = outs[0]
        d = base(choices[0])
        d["choices"] = choices
        d["usage"] = usage_json(res)
        if verbose:
            d["__verbose"] = verbose_json(ctx, tasks[0], ctx.tokenizer.decode(text_tokens(tasks[0].prompt_tokens)), res, toks_out)
        d["timings"] = res.timings.as_dict()
        keys = ("choices", "created", "model", "system_fingerprint", "object", "usage", "id", "__verbose", "timings")
        return await answer({k: d[k] for k in keys if k in d})

    def stream(index: int, task: CompletionTask, lead: bytes) -> Stream:
        n_prompt = len(task.prompt_tokens)

        def on_token(ev: TokenOut) -> list[dict[str, Any]]:
            probs = probs_json(ctx.tokenizer, [ev], False) if params.n_probs > 0 else None
            d = base({"text": ev.text, "index": index, "logprobs": {"content": probs} if probs else None,
                      "finish_reason": None})
            if verbose:
                d["__verbose"] = partial_json(index, ev, n_prompt, probs)
            if ev.timings is not None:
                d["timings"] = ev.timings.as_dict()
            return [d]

        def on_progress(ev: PromptProgress) -> list[dict[str, Any]]:
            d = base({"text": "", "index": index, "logprobs": None, "finish_reason": None})
            return [with_progress(d, ev, task.timings_per_token)]

        def on_final(res: CompletionResult) -> list[dict[str, Any]]:
            # llama-server b1-0c1e570 puts usage in this last chunk whether or not
            # stream_options.include_usage asks for it, before the id
            d = base({"text": "", "index": index, "logprobs": None, "finish_reason": finish_reason(res)})
            cid = d.pop("id")
            d["usage"], d["id"] = usage_json(res), cid
            if verbose:
                d["__verbose"] = verbose_json(ctx, task, ctx.tokenizer.decode(text_tokens(task.prompt_tokens)), res, [])
            d["timings"] = res.timings.as_dict()
            return [d]

        return Stream(ctx.engine.submit(task), on_token, on_final, on_progress, lead)

    return await stream_many(cfg.sse_ping_interval, [stream(i, t, lead) for i, (t, lead) in enumerate(zip(tasks, leads))],
                             True)


@router.post("/chat/completions")
@router.post("/v1/chat/completions")
async def chat_completions(ctx: Ctx, request: Request) -> Response:
    cfg = ctx.cfg
    body = await read_json(request)
    prep, task, params = await chat_task(ctx, body)
    n = n_choices(body, ctx.engine.n_slots)
    cmpl_id = "chatcmpl-" + random_id()
    task.cmpl_id = cmpl_id  # /v1/chat/completions/control finds the live completion by it
    if not task.stream:
        return await chat_whole(ctx, request, prep, task, params.n_probs, n, cmpl_id)
    streams = [chat_stream(ctx, prep, t, params.n_probs, cmpl_id, i) for i, t in enumerate(with_children(task, n))]
    return await stream_many(cfg.sse_ping_interval, streams, True)


@router.post("/v1/chat/completions/control")
async def chat_control(ctx: Ctx, request: Request) -> Response:
    """b1-0c1e570's control of a live chat completion: {"id": "chatcmpl-...", "action":
    "reasoning_end"} ends its reasoning now (it needs `reasoning_control: true` in that request)."""
    body = await read_json(request)
    cmpl_id, action = body.get("id"), body.get("action")
    cmpl_id = cmpl_id if isinstance(cmpl_id, str) else ""
    action = action if isinstance(action, str) else ""
    if not cmpl_id:
        raise ApiError("missing completion id")
    if action != "reasoning_end":
        raise ApiError("unknown control action")
    return await answer(await asyncio.to_thread(ctx.engine.control, cmpl_id, action))


def chat_stream(ctx: ApiContext, prep: chat_api.ChatPrep, task: CompletionTask, n_probs: int, cmpl_id: str,
                index: int) -> Stream:
    """The `chat.completion.chunk`s of choice `index`: its role chunk, its deltas, its finish (and
    usage) chunks; b1 streams `n` choices each so, interleaved."""
    cfg = ctx.cfg
    parser = chat_api.ChatOutput(prep)
    started = False

    def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"choices": choices, "created": int(time.time()), "id": cmpl_id, "model": cfg.model_name,
                "system_fingerprint": BUILD_INFO, "object": "chat.completion.chunk"}

    def role() -> dict[str, Any]:
        return chunk([{"finish_reason": None, "index": index, "delta": {"role": "assistant", "content": None}}])

    def on_token(ev: TokenOut) -> list[dict[str, Any]]:
        nonlocal started
        out = []
        if not started:
            started = True
            out.append(role())
        for delta in parser.add(ev.text):
            out.append(chunk([{"finish_reason": None, "index": index, "delta": delta}]))
        if n_probs > 0 and out:  # on the token's last chunk, as llama-server
            out[-1]["choices"][0]["logprobs"] = {"content": probs_json(ctx.tokenizer, [ev], False)}
        if ev.timings is not None and out:
            out[-1]["timings"] = ev.timings.as_dict()
        return out

    def on_progress(ev: PromptProgress) -> list[dict[str, Any]]:
        return [with_progress(role(), ev, task.timings_per_token)]

    def on_final(res: CompletionResult) -> list[dict[str, Any]]:
        out = [] if started else [role()]
        first = len(out)  # b1-0c1e570's final deltas: the parser's last ones, the finish, the usage
        for delta in parser.finish():
            out.append(chunk([{"finish_reason": None, "index": index, "delta": delta}]))
        out.append(chunk([{"finish_reason": finish_reason(res, parser.has_tool_calls), "index": index, "delta": {}}]))
        if prep.include_usage:
            u = chunk([])
            u["usage"] = usage_json(res)
            out.append(u)
        out[-1]["timings"] = res.timings.as_dict()
        if Fields(prep.body).boolean("verbose", cfg.verbose):
            out[first]["__verbose"] = verbose_json(ctx, task, prep.prompt, res, [], prep.reasoning_format)
        return out

    return Stream(ctx.engine.submit(task), on_token, on_final, on_progress)


def verbose_json(ctx: ApiContext, task: CompletionTask, prompt: str, res: CompletionResult,
                 toks: list[TokenOut], reasoning_format: str | None = None) -> dict[str, Any]:
    """`__verbose` (`"verbose"`, by default with -v): the native final object of the task
    (`reasoning_format`: a chat request's own, else the server's; streamed: no content, no tokens)."""
    p = task.params
    settings = sampling_settings(p, task.n_predict, task.stream, task.chat_format,
                                 reasoning_format_name(reasoning_format or ctx.cfg.reasoning_format), only_metrics=False,
                                 stop=task.stop, n_keep=task.n_keep, n_discard=task.n_discard,
                                 timings_per_token=task.timings_per_token,
                                 generation_prompt=task.generation_prompt, spec_types=ctx.cfg.spec_types)
    req = NativeRequest(task, settings, prompt, p.n_probs, False)
    return completion_final_json(ctx, req, res, toks or res.probs, task.stream)


async def chat_whole(ctx: ApiContext, request: Request, prep: chat_api.ChatPrep, task: CompletionTask,
                     n_probs: int, n: int, cmpl_id: str) -> Response:
    """A non-streamed chat completion with `n` choices."""
    outs = await collect_all(request, [ctx.engine.submit(t) for t in with_children(task, n)])
    choices = []
    for i, (toks_out, res) in enumerate(outs):
        msg = chat_api.ChatOutput(prep).final_message(res.content)
        choice: dict[str, Any] = {"finish_reason": finish_reason(res, bool(msg.get("tool_calls"))),
                                  "index": i, "message": msg}
        if n_probs > 0:
            choice["logprobs"] = {"content": probs_json(ctx.tokenizer, toks_out or res.probs, False)}
        choices.append(choice)
    toks_out, res = outs[0]
    d = {"choices": choices, "created": int(time.time()), "model": ctx.cfg.model_name,
         "system_fingerprint": BUILD_INFO, "object": "chat.completion", "usage": usage_json(res), "id": cmpl_id}
    if Fields(prep.body).boolean("verbose", ctx.cfg.verbose):
        d["__verbose"] = verbose_json(ctx, task, prep.prompt, res, toks_out, prep.reasoning_format)
    d["timings"] = res.timings.as_dict()
    return await answer(d)

"""llama-server's own generation routes: `/completion` (alias `/completions`) and `/infill`.

A request becomes a `NativeRequest` (the CompletionTask plus what the response echoes); the
response is the final object, or an SSE stream of one chunk per token and then the final object.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api import infill as infill_api
from api.choices import n_choices, with_children
from api.context import ApiContext, Ctx
from api.errors import ApiError, answer
from api.inputs import (check_context, check_task_count, off_loop, prompt_with_media, read_json, split_prompts,
                        text_tokens)
from api.params import Fields, parse_sampling, parse_task, reasoning_format_name, sampling_settings
from api.results import NativeRequest, collect_all, completion_final_json, partial_json, probs_json, with_progress
from api.sse import Stream, stream_many
from runtime.tasks import PromptProgress, SamplingParams, TokenOut

router = APIRouter()


def native_request(ctx: ApiContext, body: dict[str, Any], prompt_tokens: list[int], index: int = 0,
                   params: SamplingParams | None = None) -> NativeRequest:
    """`params`: the body's, when already parsed (one request's prompts share them)."""
    if params is None:
        params = parse_sampling(body, ctx.cfg.defaults, ctx.tokenizer, ctx.engine.n_ctx_slot)
    task = parse_task(body, prompt_tokens, params, ctx.cfg.n_predict, defaults=ctx.cfg.request_defaults)
    f = Fields(body)
    settings = sampling_settings(params, task.n_predict, task.stream, "Content-only",
                                 reasoning_format_name(ctx.cfg.reasoning_format),
                                 only_metrics=False, stop=task.stop, n_keep=task.n_keep, n_discard=task.n_discard,
                                 timings_per_token=f.boolean("timings_per_token", False),
                                 post_sampling_probs=f.boolean("post_sampling_probs", False), spec_types=ctx.cfg.spec_types)
    settings["lora"] = [{"id": i, "scale": s} for i, s in sorted((task.lora or {}).items())]
    return NativeRequest(task, settings, ctx.tokenizer.decode(text_tokens(prompt_tokens)), params.n_probs,
                         f.boolean("post_sampling_probs", False), index)


def native_stream(ctx: ApiContext, req: NativeRequest, lead: bytes = b"") -> Stream:
    """The SSE chunks of one native request: a chunk per token, then the final object."""
    def on_token(ev: TokenOut) -> list[dict[str, Any]]:
        probs = probs_json(ctx.tokenizer, [ev], req.post_sampling) if req.n_probs > 0 else None
        return [partial_json(req.index, ev, len(req.task.prompt_tokens), probs)]

    def on_progress(ev: PromptProgress) -> list[dict[str, Any]]:
        # llama-server's progress partial: an empty token (id 0), nothing generated yet
        d = {"index": req.index, "content": "", "tokens": [0], "stop": False, "id_slot": -1,
             "tokens_predicted": 0, "tokens_evaluated": len(req.task.prompt_tokens)}
        return [with_progress(d, ev, req.task.timings_per_token)]

    return Stream(ctx.engine.submit(req.task), on_token, lambda res: [completion_final_json(ctx, req, res, [], True)],
                  on_progress, lead)


@router.post("/completion")
@router.post("/completions")
async def completion(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    if "prompt" not in body:
        raise ApiError("[json.exception.out_of_range.403] key 'prompt' not found")
    prompts = split_prompts(body["prompt"])
    n = n_choices(body, ctx.engine.n_slots)
    check_task_count(len(prompts) * n)
    reqs, leads = [], []
    for i, p in enumerate(prompts):  # each prompt, then its n - 1 children; indexes run over all of them
        toks, media = await prompt_with_media(ctx, p)
        check_context(len(toks), ctx.engine.n_ctx_slot)
        # off the loop: decodes the prompt, and the first prompt's parses the sampling fields (compiles the grammar)
        first = await off_loop(native_request, ctx, body, toks, 0, reqs[0].task.params if reqs else None)
        first.task.media = media
        for j, task in enumerate(with_children(first.task, n)):
            reqs.append(dataclasses.replace(first, task=task, index=len(reqs)))
            # b1 streams each further prompt's "processing started" signal as `data: null`
            # (the first prompt's is the response's headers); children send none
            leads.append(b"data: null\n\n" if i > 0 and j == 0 else b"")
    if reqs[0].task.stream:
        return await stream_many(ctx.cfg.sse_ping_interval, [native_stream(ctx, r, lead) for r, lead in zip(reqs, leads)],
                                 False)
    outs = await collect_all(request, [ctx.engine.submit(r.task) for r in reqs])
    results = [completion_final_json(ctx, r, res, toks or res.probs, False) for r, (toks, res) in zip(reqs, outs)]
    return await answer(results[0] if len(results) == 1 else results)


@router.post("/infill")
async def infill(ctx: Ctx, request: Request) -> Response:
    tok = ctx.tokenizer
    infill_api.check_model(tok.fim_ids)
    body = await read_json(request)
    extra = infill_api.parse_extra(body)
    prefix, suffix = infill_api.prefix_and_suffix(body)
    prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else ""  # b1: json_value, a string

    def tokens() -> list[int]:  # off the event loop: the pieces may be megabytes
        prompt_tokens = list(tok.encode(prompt, add_special=False, parse_special=True)) if prompt else []
        return infill_api.format_infill(tok, prefix, suffix, extra, prompt_tokens,
                                        ctx.engine.cfg.n_batch, ctx.cfg.n_predict, ctx.engine.n_ctx_slot,
                                        ctx.cfg.spm_infill)
    toks = await off_loop(tokens)
    check_context(len(toks), ctx.engine.n_ctx_slot)
    req = await off_loop(native_request, ctx, body, toks, 0)
    req.task.infill = True
    if req.task.stream:
        return await stream_many(ctx.cfg.sse_ping_interval, [native_stream(ctx, req)], False)
    [(toks_out, res)] = await collect_all(request, [ctx.engine.submit(req.task)])
    return await answer(completion_final_json(ctx, req, res, toks_out or res.probs, False))

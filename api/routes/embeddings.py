"""Embedding routes (`--embeddings` servers): OpenAI's `/v1/embeddings` (floats or base64) and
llama-server's `/embedding` (alias `/embeddings`), one EmbeddingTask per input."""
from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.context import ApiContext, Ctx
from api.errors import ApiError, answer, not_supported
from api.inputs import check_context, check_task_count, off_loop, read_json, tokenize_prompt
from api.params import Fields
from api.results import collect
from runtime.tasks import EmbeddingTask

router = APIRouter()


def embedding_inputs(ctx: ApiContext, body: dict[str, Any]) -> list[list[int]]:
    """`input` (or `content`): a string, a token list, or a list of either -> token lists."""
    raw = body.get("input") if body.get("input") is not None else body.get("content")
    if raw is None:
        raise ApiError('"input" or "content" must be provided')
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw)):
        items: list[Any] = [raw]
    elif isinstance(raw, list):
        items = raw
    else:
        raise ApiError('"input" must be a string, a list of tokens, or a list of strings')
    check_task_count(len(items))
    out = []
    for it in items:
        toks = tokenize_prompt(ctx.tokenizer, it)
        if not toks:
            raise ApiError("Input content cannot be empty")
        check_context(len(toks), ctx.engine.n_ctx_slot)
        out.append(toks)
    return out


async def run_embeddings(ctx: ApiContext, body: dict[str, Any], oai: bool) -> tuple[list[list[int]], list[Any]]:
    """The inputs' token lists and, for each, the engine's vectors (one per token with pooling none)."""
    cfg = ctx.cfg
    if not cfg.embeddings:
        raise not_supported("This server does not support embeddings. Start it with `--embeddings`")
    pooling = cfg.pooling or ctx.engine.model_info.get("pooling", "none")  # --pooling, else the model's
    if oai and pooling == "none":
        raise ApiError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    inputs = await off_loop(embedding_inputs, ctx, body)
    normalize = Fields(body).integer("embd_normalize", cfg.embd_normalize)
    handles = [ctx.engine.submit(EmbeddingTask(t, pooling, normalize)) for t in inputs]
    outs = await asyncio.gather(*(collect(h) for h in handles))
    return inputs, [res for _, res in outs]


@router.post("/v1/embeddings")
async def oai_embeddings(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    inputs, results = await run_embeddings(ctx, body, True)
    b64 = body.get("encoding_format") == "base64"
    data = []
    for i, vecs in enumerate(results):
        vec = vecs[0]
        emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
        data.append({"embedding": emb, "index": i, "object": "embedding"})
    n = sum(len(t) for t in inputs)
    return await answer({"model": body.get("model") or ctx.cfg.model_name, "object": "list",
                          "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data})


@router.post("/embedding")
@router.post("/embeddings")
async def native_embeddings(ctx: Ctx, request: Request) -> Response:
    body = await read_json(request)
    _, results = await run_embeddings(ctx, body, False)
    return await answer([{"index": i, "embedding": vecs} for i, vecs in enumerate(results)])

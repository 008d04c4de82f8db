"""`/rerank` (also `/reranking`, `/v1/rerank`, `/v1/reranking`) on a `--rerank` server, as
llama-server b1-0c1e570's `post_rerank` (server-context.cpp) with `format_prompt_rerank` and
`format_response_rerank` (server-common.cpp).

Jina's shape (`query`, `documents`, `top_n`) answers `{model, object, usage, results: [{index,
relevance_score}]}`; TEI's (`texts` instead of `documents`, `return_text`) a bare list of `{index,
score[, text]}`. Each document is one task: the model's `tokenizer.chat_template.rerank` with
`{query}` and `{document}` replaced (special tokens parsed, none added), else
`[BOS] query [EOS] [SEP] document [EOS]` as the vocabulary adds them. The score is the RANK
pooling of the engine (runtime/serving/runner.py `pool_embeddings`, `Model.rank_scores`), as a
float32 like b1's. Results are sorted by score, highest first, then cut to `top_n`.
"""
from __future__ import annotations

import asyncio
import struct
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.context import ApiContext, Ctx
from api.errors import ApiError, answer, not_supported
from api.inputs import check_context, check_task_count, off_loop, read_json
from api.results import collect
from runtime.tasks import EmbeddingTask

router = APIRouter()


def _strings(v: Any) -> list[str] | None:
    """nlohmann's get<std::vector<std::string>>, None where it would throw."""
    return v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None


def _value(body: dict, key: str, default: Any, conv) -> Any:
    """json_value: the field converted, the default when absent, null or of the wrong type."""
    v = body.get(key)
    if v is None:
        return default
    out = conv(v)
    return default if out is None else out


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return (v + (1 << 31)) % (1 << 32) - (1 << 31)  # to int32, as the C++ conversion wraps
    if isinstance(v, float):
        return int(max(min(v, 2**31 - 1), -(2**31))) if v == v else 0
    return None


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def rerank_prompt(ctx: ApiContext, query: str, doc: str) -> list[int]:
    tok = ctx.tokenizer
    fmt = ctx.engine.model_info.get("rerank") or {}
    if fmt.get("template"):
        return tok.encode(fmt["template"].replace("{query}", query).replace("{document}", doc),
                          add_special=False, parse_special=True)
    q = tok.encode(query, add_special=False, parse_special=False)
    d = tok.encode(doc, add_special=False, parse_special=False)
    eos = tok.eos_id if tok.eos_id is not None and tok.eos_id >= 0 else fmt.get("sep", -1)
    out = [tok.bos_id] if tok.add_bos else []
    out += q + ([eos] if tok.add_eos else []) + ([fmt.get("sep", -1)] if fmt.get("add_sep") else [])
    return out + d + ([eos] if tok.add_eos else [])


def _prompts(ctx: ApiContext, query: str, docs: list[str]) -> list[list[int]]:
    check_task_count(len(docs))
    out = []
    for d in docs:
        toks = rerank_prompt(ctx, query, d)
        check_context(len(toks), ctx.engine.n_ctx_slot)
        out.append(toks)
    return out


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank(ctx: Ctx, request: Request) -> Response:
    if not ctx.cfg.embeddings or ctx.cfg.pooling != "rank":
        raise not_supported("This server does not support reranking. Start it with `--reranking`")
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError('"query" must be provided')
    tei = "texts" in body
    if "query" not in body:
        raise ApiError('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise ApiError('"query" must be a string')
    docs = _value(body, "documents", _value(body, "texts", [], _strings), _strings)
    if not docs:
        raise ApiError('"documents" must be a non-empty string array')
    top_n = _value(body, "top_n", len(docs), _int)
    if top_n < 0:  # b1: std::vector::resize of a negative count (a length_error, its 500)
        raise ApiError("vector::_M_default_append", "server_error", 500)
    prompts = await off_loop(_prompts, ctx, query, docs)
    handles = [ctx.engine.submit(EmbeddingTask(t, "rank", -1)) for t in prompts]
    outs = await asyncio.gather(*(collect(h) for h in handles))
    label = "score" if tei else "relevance_score"
    return_text = tei and body.get("return_text") is True
    elems = []
    n_tokens = 0
    for i, ((_, vecs), toks) in enumerate(zip(outs, prompts)):
        e: dict[str, Any] = {"index": i, label: f32(vecs[0][0])}
        if return_text:
            e["text"] = docs[i]
        elems.append(e)
        n_tokens += len(toks)
    elems.sort(key=lambda e: -e[label])
    elems = elems[:top_n]
    if tei:
        return await answer(elems)
    model = body.get("model") if isinstance(body.get("model"), str) else ctx.cfg.model_name
    return await answer({"model": model, "object": "list",
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": elems})

"""What the server is: `/health`, `/models` (llama-server's merged Ollama + OpenAI listing) and
`/props` (read, and the `--props` write that changes nothing here)."""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api import chat as chat_api
from api.context import BUILD_INFO, ApiContext, Ctx
from api.errors import json_response, not_supported
from api.inputs import read_json
from api.params import sampling_settings

router = APIRouter()


@router.get("/health")
@router.get("/v1/health")
async def health() -> Response:
    return json_response({"status": "ok"})


def model_data(ctx: ApiContext) -> dict[str, Any]:
    """The model's OpenAI-style entry (`/v1/models` data[0]; what a router's worker reports)."""
    info = dict(ctx.engine.model_info)
    meta: dict[str, Any] = {
        "vocab_type": info.get("vocab_type", 0),
        "n_vocab": info.get("n_vocab", ctx.tokenizer.n_vocab),
        "n_ctx": ctx.engine.n_ctx_slot,
        "n_ctx_train": info.get("n_ctx_train", 0),
        "n_embd": info.get("n_embd", 0),
        "n_params": info.get("n_params", 0),
        "size": info.get("size", 0),
    }
    if "ftype" in info:
        meta["ftype"] = info["ftype"]
    return {"id": ctx.cfg.model_name, "aliases": list(ctx.cfg.aliases), "tags": list(ctx.cfg.tags), "object": "model",
            "created": int(time.time()), "owned_by": "llamacpp", "meta": meta}


@router.get("/models")
@router.get("/v1/models")
async def models(ctx: Ctx) -> Response:
    name = ctx.cfg.model_name
    caps = ["completion", "multimodal"] if any(modalities(ctx).values()) else ["completion"]
    return json_response({
        "models": [{
            "name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""], "capabilities": caps, "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
        "object": "list",
        "data": [model_data(ctx)],
    })


def modalities(ctx) -> dict[str, bool]:
    """What the --mmproj file encodes (both False without one)."""
    return dict({"vision": False, "video": False, "audio": False}, **(getattr(ctx.engine, "modalities", None) or {}))


@router.get("/props")
async def props(ctx: Ctx) -> Response:
    cfg, tok, tmpl = ctx.cfg, ctx.tokenizer, ctx.engine.chat_template
    settings = sampling_settings(cfg.defaults, cfg.n_predict, False, "Content-only", "none", only_metrics=True,
                                 stop=cfg.request_defaults.stop, n_keep=cfg.request_defaults.n_keep)
    return json_response({
        "default_generation_settings": {"params": settings, "n_ctx": ctx.engine.n_ctx_slot},
        "total_slots": ctx.engine.n_slots,
        "model_alias": cfg.model_name,
        "model_ftype": ctx.engine.model_info.get("ftype", ""),
        "model_path": cfg.model_path,
        "modalities": {k: modalities(ctx)[k] for k in ("vision", "video", "audio")},
        "media_marker": ctx.media_marker,
        "endpoint_slots": cfg.slots,
        "endpoint_props": cfg.props,
        "endpoint_metrics": cfg.metrics,
        "ui": cfg.ui,
        "ui_settings": cfg.ui_settings,
        "chat_template": chat_api.template_source(tmpl),
        "chat_template_caps": chat_api.template_caps(tmpl),
        "bos_token": chat_api.special_text(tok, tok.bos_id),
        "eos_token": chat_api.special_text(tok, tok.eos_id),
        "build_info": BUILD_INFO,
        "is_sleeping": bool(getattr(ctx.engine, "sleeping", False)),
        "cors_proxy_enabled": False,
    })


@router.post("/props")
async def set_props(ctx: Ctx, request: Request) -> Response:
    if not ctx.cfg.props:
        raise not_supported("This server does not support changing global properties. Start it with `--props`")
    await read_json(request)
    return json_response({"success": True})

"""The router's HTTP side (llama-server b1-0c1e570's `server_models_routes`, server.cpp's router
branch): `GET /models` (also `/v1/models`) lists every model with its state, `POST /models/load`,
`POST /models/unload`, `GET /models/sse` (state changes as events), `DELETE /models?model=`
(a cached model's files), `GET /props` (the router's own, or a model's with `?model=`); every
other route is proxied to the worker of the model its body's `model` field (POST) or its
`?model=` query parameter (GET) names, loading it first when `--models-autoload` (or
`?autoload=true|1`) says so (runtime/launch/router.py owns the workers; api/proxy.py relays).

The app has the single-model server's outer layers (api/guard.py: body limits, cancellation on
disconnect, drain; HEAD; header case) and its pre-routing (CORS, the API key but on /health;
`Server: llama.cpp`). No engine, no torch: a worker does the model work.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from api.context import BUILD_INFO, ServerConfig
from api.cors import cors_headers
from api.errors import ApiError, invalid_api_key, json_response, not_found
from api.guard import Drain, RequestGuard
from api.head import HeadAsGet
from api.header_case import CanonicalHeaderCase
from api.log import Logger
from api.proxy import open_proxy
from api.strict_json import loads
from runtime.launch.model_sources import ModelSource, hf_cache_dir
from runtime.launch.router import ModelRouter, ModelStatus, RouterError

__all__ = ["create_router_app", "RouterContext"]

PUBLIC = {"/health", "/v1/health"}
# what the router proxies (server.cpp: routes.* = models_routes->proxy_post / proxy_get)
PROXY_POST = ["/props", "/completion", "/completions", "/v1/completions", "/chat/completions",
              "/v1/chat/completions", "/v1/chat/completions/control", "/v1/responses", "/responses",
              "/v1/audio/transcriptions", "/audio/transcriptions", "/v1/messages", "/v1/messages/count_tokens",
              "/infill", "/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank",
              "/v1/reranking", "/tokenize", "/detokenize", "/apply-template", "/chat/completions/input_tokens",
              "/v1/chat/completions/input_tokens", "/responses/input_tokens", "/v1/responses/input_tokens",
              "/lora-adapters", "/slots/{id_slot}"]
PROXY_GET = ["/metrics", "/lora-adapters", "/slots"]


class RouterContext:
    """What the routes share: the settings, the model table, the logger (app.state.server)."""

    def __init__(self, cfg: ServerConfig, models: ModelRouter, log: Logger, ui_settings: dict | None = None):
        self.cfg, self.models, self.log = cfg, models, log
        self.ui_settings = ui_settings or {}
        self.stopping = False
        self.hf_token: str | None = None  # POST /models downloads (--hf-token, else HF_TOKEN)
        self.offline = False


def _ctx(request: Request) -> RouterContext:
    return request.app.state.server


def _err(message: str, type: str = "invalid_request_error") -> Response:
    return ApiError(message, type).response()


def _autoload(ctx: RouterContext, request: Request) -> bool:
    v = request.query_params.get("autoload", "")
    return ctx.models.settings.autoload if not v else v in ("true", "1")


def _validate(ctx: RouterContext, name: str, autoload: bool) -> tuple[str, Response | None]:
    """router_validate_model: the canonical name, or the error to answer."""
    if not name:
        return name, _err("model name is missing from the request")
    e = ctx.models.get(name)
    if e is None:
        return name, _err(f"model '{name}' not found")
    if not autoload and not e.running:
        return e.name, _err("model is not loaded")
    return e.name, None


async def _proxy(ctx: RouterContext, request: Request, name: str, body: bytes, update_last_used: bool) -> Response:
    models = ctx.models
    try:
        e = models.begin_request(name, update_last_used)
    except RouterError as ex:
        return _err(str(ex), "invalid_request_error" if ex.invalid else "server_error")
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            models.end_request(name)
    try:
        if models.settings.fake_timing:
            await asyncio.sleep(2)  # the model counts as busy meanwhile (b1 does the same)
        ctx.log.srv("I", "proxy_reques", f"proxying request to model {name} on port {e.port}")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return await open_proxy(request.method, e.port, target, list(request.scope["headers"]), body,
                                ctx.cfg.read_timeout or 600.0, on_close=release)
    except BaseException:
        release()
        raise


async def _ensure(ctx: RouterContext, name: str, autoload: bool) -> Response | None:
    if not autoload:
        return None
    try:
        await ctx.models.ensure_ready(name)
    except RouterError as ex:
        return _err(str(ex), "server_error")
    return None


async def proxy_get(request: Request) -> Response:
    ctx = _ctx(request)
    autoload = _autoload(ctx, request)
    name, error = _validate(ctx, request.query_params.get("model", ""), autoload)
    if error is None:
        error = await _ensure(ctx, name, autoload)
    return error or await _proxy(ctx, request, name, b"", False)


async def proxy_post(request: Request) -> Response:
    ctx = _ctx(request)
    body = await request.body()
    data = loads(body)
    raw = data.get("model") if isinstance(data, dict) else None
    autoload = _autoload(ctx, request)
    name, error = _validate(ctx, raw if isinstance(raw, str) else "", autoload)
    if error is None:
        error = await _ensure(ctx, name, autoload)
    return error or await _proxy(ctx, request, name, body, True)


async def health(request: Request) -> Response:
    return json_response({"status": "ok"})


async def props(request: Request) -> Response:
    ctx = _ctx(request)
    if request.query_params.get("model", ""):
        return await proxy_get(request)
    s = ctx.models.settings
    return json_response({
        "role": "router", "max_instances": s.models_max, "models_autoload": s.autoload,
        "model_alias": "llama-server", "model_path": "none",
        "default_generation_settings": {"params": None, "n_ctx": 0},  # (b1's json{} is null)
        "ui_settings": ctx.ui_settings, "build_info": BUILD_INFO, "cors_proxy_enabled": ctx.cfg.ui_mcp_proxy,
    })


def _preset_ini(name: str, options: dict[str, str]) -> str:
    hidden = ("ssl-key-file", "ssl-cert-file", "api-key", "api-key-file", "models-dir", "models-max",
              "models-preset", "models-autoload", "host", "port", "alias", "tags")
    lines = [f"[{name}]"] + [f"{k} = {v.replace(chr(10), chr(92) + chr(10))}" for k, v in options.items()
                             if k not in hidden]
    return "\n".join(lines) + "\n\n"


async def list_models(request: Request) -> Response:
    ctx = _ctx(request)
    if request.query_params.get("reload", ""):
        await ctx.models.reload()
    now = int(time.time())
    data = []
    for e in list(ctx.models.models.values()):
        if e.hidden:
            continue
        status: dict[str, Any] = {"value": e.status.value, "args": list(e.args), "preset": _preset_ini(e.name, e.options)}
        if e.failed:
            status["exit_code"], status["failed"] = e.exit_code, True
        info: dict[str, Any] = {
            "id": e.name, "aliases": list(e.aliases), "tags": list(e.tags), "object": "model", "owned_by": "llamacpp",
            "created": now, "status": status,
            "architecture": {"input_modalities": list(e.inputs), "output_modalities": ["text"]},
            "source": e.source.value, "can_remove": e.source is ModelSource.CACHE,
        }
        if e.running:
            for k, v in e.loaded_info.items():
                info.setdefault(k, v)
        data.append(info)
    return json_response({"data": data, "object": "list"})


async def load_model(request: Request) -> Response:
    ctx = _ctx(request)
    data = loads(await request.body())
    name = data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else ""
    e = ctx.models.get(name)
    if e is None:  # b1 answers not_found_error, which its HTTP layer turns into its 404 page
        return not_found().response()
    if e.running:
        return _err("model is already running")
    try:
        await ctx.models.load(e.name)
    except RouterError as ex:
        return _err(str(ex), "server_error")
    return json_response({"success": True})


async def unload_model(request: Request) -> Response:
    ctx = _ctx(request)
    data = loads(await request.body())
    name = data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else ""
    e = ctx.models.get(name)
    if e is None:
        return _err("model is not found")
    if not e.running and e.status is not ModelStatus.DOWNLOADING:
        return _err("model is not running")
    ctx.models.unload(e.name)
    return json_response({"success": True})


async def download_model(request: Request) -> Response:
    """`POST /models {"model": "user/repo[:quant]"}`: into the Hugging Face cache, then listed."""
    from runtime.launch.hf_download import HfModelRequest, download_model as fetch

    ctx = _ctx(request)
    data = loads(await request.body())
    name = data.get("model") if isinstance(data, dict) and isinstance(data.get("model"), str) else ""
    if not name:
        return _err("model must be a non-empty string")
    req = HfModelRequest(name, token=ctx.hf_token, offline=ctx.offline, cache_dir=str(hf_cache_dir()))
    try:
        await ctx.models.download(name, lambda: fetch(req))
    except RouterError as ex:
        return _err(str(ex), "invalid_request_error" if ex.invalid else "server_error")
    return json_response({"success": True})


async def delete_model(request: Request) -> Response:
    ctx = _ctx(request)
    name = request.query_params.get("model", "")
    if not name:
        return _err("model must be a non-empty string")
    try:
        await ctx.models.remove(name)
    except RouterError as ex:
        return _err(str(ex), "server_error")
    return json_response({"success": True})


async def models_sse(request: Request) -> Response:
    ctx = _ctx(request)
    q = ctx.models.subscribe()

    async def events():
        try:
            while not ctx.stopping:
                try:
                    msg = await asyncio.wait_for(q.get(), 1.0)
                except TimeoutError:
                    continue
                if msg is None:
                    return
                yield ("data: " + json_response(msg).body.decode() + "\n\n").encode()
        finally:
            ctx.models.unsubscribe(q)
    return StreamingResponse(events(), media_type="text/event-stream")


def _key_ok(cfg: ServerConfig, request: Request) -> bool:
    auth = request.headers.get("authorization", "")
    key = auth[7:] if auth.startswith("Bearer ") else request.headers.get("x-api-key", "")
    return any(secrets.compare_digest(key.encode(), k.encode()) for k in cfg.api_keys)


class RouterPreRouting:
    """CORS (a preflight answered here), the API key (/health is public), `Server: llama.cpp`."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        cfg = request.app.state.server.cfg
        preflight = request.method == "OPTIONS"
        cors = cors_headers(cfg, request.headers.get("origin"), preflight)
        extra = [(b"server", b"llama.cpp")] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cors.items()]
        names = {k for k, _ in extra}

        async def send_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(k, v) for k, v in message.get("headers", ())
                                                  if k.lower() not in names] + extra}
            await send(message)
        if preflight:
            await Response(b"", status_code=200, media_type="text/html")(scope, receive, send_headers)
        elif cfg.api_keys and request.url.path not in PUBLIC and not _key_ok(cfg, request):
            await invalid_api_key().response()(scope, receive, send_headers)
        else:
            await self.app(scope, receive, send_headers)


async def _on_api_error(request: Request, e: Exception) -> Response:
    return await e.response_async()  # type: ignore[attr-defined]


async def _on_http_error(request: Request, e: Exception) -> Response:
    return not_found().response()


async def _on_error(request: Request, e: Exception) -> Response:
    _ctx(request).log.srv("W", "operator()", f"got exception: {e}")
    return ApiError(str(e) or "unknown error", "server_error", 500).response()


def create_router_app(cfg: ServerConfig, models: ModelRouter, log: Logger, ui_settings: dict | None = None) -> Starlette:
    from starlette.exceptions import HTTPException

    routes = [Route(p, health, methods=["GET"]) for p in ("/health", "/v1/health")]
    routes += [Route(p, list_models, methods=["GET"]) for p in ("/models", "/v1/models")]
    routes += [Route("/models/load", load_model, methods=["POST"]), Route("/models/unload", unload_model, methods=["POST"]),
               Route("/models/sse", models_sse, methods=["GET"]), Route("/models", delete_model, methods=["DELETE"]),
               Route("/models", download_model, methods=["POST"]),
               Route("/props", props, methods=["GET"])]
    routes += [Route(p, proxy_post, methods=["POST"]) for p in PROXY_POST]
    routes += [Route(p, proxy_get, methods=["GET"]) for p in PROXY_GET]
    app = Starlette(routes=routes, exception_handlers={ApiError: _on_api_error, HTTPException: _on_http_error,
                                                       Exception: _on_error})
    app.state.server = RouterContext(cfg, models, log, ui_settings)
    app.state.drain = Drain()
    app.add_middleware(RouterPreRouting)
    app.add_middleware(HeadAsGet)
    app.add_middleware(RequestGuard)
    app.add_middleware(CanonicalHeaderCase)
    return app

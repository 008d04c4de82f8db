"""The llama-server compatible FastAPI application.

`create_app(cfg, engine, log)` builds the app around an engine (api/engine_api.py `EngineAPI`)
that may still be loading: every route answers 503 `Loading model` until the CLI's loader thread
attaches the engine and calls `app.state.server.set_ready()`. The routes live in api/routes/, one
module per family; they talk to the engine only through plain data (token ids, `runtime.tasks`
dataclasses, dicts).

Before any route, as llama-server's pre-routing (server-http.cpp): CORS (an OPTIONS preflight is
answered here), readiness, then the API key (`Authorization: Bearer` or `X-Api-Key`; /health is
public); then a sleeping engine (`--sleep-idle-seconds`) is woken unless the route is one that
answers from what stays loaded (health, metrics, props, models). Every response carries `Server: llama.cpp`. Errors are llama-server's envelope
(api/errors.py); an unknown route or method is its 404 `File Not Found`.
"""
from __future__ import annotations

import asyncio
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.context import ApiContext, ServerConfig
from api.cors import cors_headers
from api.engine_api import EngineAPI
from api.header_case import CanonicalHeaderCase
from api.errors import ApiError, invalid_api_key, loading_model, not_found
from api.head import HeadAsGet
from api.guard import Drain, RequestGuard
from api.log import Logger
from api.openapi import build_openapi
from api.routes import ROUTERS
from api.routes.gcp import register_gcp
from api.routes.ui import FRONTEND_PATHS, static_file
from runtime.serving.failures import describe

__all__ = ["ApiContext", "ServerConfig", "create_app"]

PUBLIC_PATHS = {"/health", "/v1/health"}
# what answers without waking a sleeping server (--sleep-idle-seconds), as llama-server's
# create_response(bypass_sleep = true)
SLEEP_BYPASS = {"/health", "/v1/health", "/metrics", "/props", "/models", "/v1/models"}


def create_app(cfg: ServerConfig, engine: EngineAPI | None, log: Logger | None = None) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)  # llama-server serves no /openapi.json
    app.openapi = lambda: build_openapi(app)  # request bodies as llama-server's README (api/openapi.py)
    app.state.server = ApiContext(cfg, engine, log or Logger())
    app.add_middleware(PreRouting)  # innermost of the four: CORS, loading, API key
    app.state.drain = Drain()
    app.add_middleware(HeadAsGet)  # HEAD answered by the GET routes, no body (api/head.py)
    app.add_middleware(RequestGuard)  # body limits, disconnects, drain (api/guard.py)
    app.add_middleware(CanonicalHeaderCase)  # outermost: names as llama-server spells them
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_error)
    for router in ROUTERS:
        app.include_router(router)
    register_gcp(app)  # AIP_MODE=PREDICTION: Vertex AI's /predict (api/routes/gcp.py)
    return app


def key_ok(cfg: ServerConfig, request: Request) -> bool:
    auth = request.headers.get("authorization", "")
    key = auth[7:] if auth.startswith("Bearer ") else request.headers.get("x-api-key", "")
    return any(secrets.compare_digest(key.encode(), k.encode()) for k in cfg.api_keys)


class PreRouting:
    """CORS, loading state, API key, in server-http.cpp's pre-routing order; `Server: llama.cpp`
    and the CORS headers on every response. A plain ASGI layer: a streamed response's chunks pass
    straight through (Starlette's `BaseHTTPMiddleware` copied each through a memory stream and a
    task switch, ~0.1 ms of the event loop per SSE chunk)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        ctx: ApiContext = request.app.state.server
        cfg = ctx.cfg
        preflight = request.method == "OPTIONS"
        cors = cors_headers(cfg, request.headers.get("origin"), preflight)
        extra = [(b"server", b"llama.cpp")] + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cors.items()]
        names = {k for k, _ in extra}

        async def send_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in names]
                message = {**message, "headers": headers + extra}
            await send(message)

        if preflight:  # answered before readiness and the API key: browsers send no credentials here
            await Response(b"", status_code=200, media_type="text/html")(scope, receive, send_headers)
            return
        page = cfg.ui and request.url.path in FRONTEND_PATHS  # the web page: public, served while loading
        if not ctx.ready and not page:
            resp = loading_model().response()
        elif cfg.api_keys and request.url.path not in PUBLIC_PATHS and not page and not key_ok(cfg, request):
            resp = invalid_api_key().response()
        else:
            try:
                if getattr(ctx.engine, "sleeping", False) and not page and not (
                        request.method == "GET" and request.url.path in SLEEP_BYPASS):
                    await asyncio.to_thread(ctx.engine.wake)
                resp = None
                if cfg.public_path and cfg.ui and request.method in ("GET", "HEAD"):  # before the routes, as httplib
                    resp = static_file(cfg.public_path, request.url.path)
            except ApiError as e:
                resp = await e.response_async()
            if resp is None:
                await self.app(scope, receive, send_headers)
                return
        await resp(scope, receive, send_headers)


async def on_api_error(request: Request, e: ApiError) -> Response:
    return await e.response_async()  # a long message is serialised off the event loop


async def on_http_error(request: Request, e: StarletteHTTPException) -> Response:
    if e.status_code in (404, 405):
        return not_found().response()
    return ApiError(str(e.detail), "server_error", e.status_code).response()


async def on_error(request: Request, e: Exception) -> Response:
    request.app.state.server.log.srv("E", "operator()", f"got exception: {e!r}")
    return await ApiError(describe(e), "server_error", 500).response_async()  # in words: no Python names


class PrefixedApp:
    """`--api-prefix P`: every route answers at P + its path (server-http.cpp registers each as
    `path_prefix + path`); a path outside P reaches no route (llama-server's 404 envelope)."""

    def __init__(self, app: Any, prefix: str):
        self.app, self.prefix = app, prefix.rstrip("/")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") in ("http", "websocket") and self.prefix:
            path = scope.get("path", "")
            if path == self.prefix or path.startswith(self.prefix + "/"):
                inner = path[len(self.prefix):] or "/"
            else:
                inner = "/\x00outside-api-prefix" + path  # matches no route
            scope = dict(scope, path=inner, raw_path=inner.encode("utf-8", "surrogateescape"))
        await self.app(scope, receive, send)

"""`GET/POST /cors-proxy?url=...` (llama-server's server-cors-proxy.h, used by its web UI to reach
MCP servers): with `--ui-mcp-proxy` the request is forwarded to `url`; otherwise 403
`feature_disabled`.

Only the headers the client names explicitly travel: `x-llama-server-proxy-header-NAME: v` becomes
`NAME: v`; the client's own Authorization, Cookie, API key and proxy credentials never do.
"""
from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.context import Ctx
from api.errors import ApiError, dumps

router = APIRouter()

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600  # llama-server's read and write timeouts


def forwarded_headers(request: Request) -> dict[str, str]:
    out = {}
    for key, value in request.headers.items():  # starlette gives the names in lower case
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX):
            out[key[len(PREFIX):]] = value
    return out


def check_target(url: str) -> None:
    u = urlsplit(url)
    if "://" not in url or not u.hostname:
        raise ApiError("invalid target URL: missing host", "server_error", 500)
    if u.password:
        raise ApiError("authentication in target URL is not supported", "server_error", 500)
    if u.scheme not in ("http", "https"):
        raise ApiError(f"unsupported URL scheme in target URL: {u.scheme}", "server_error", 500)


def fetch(method: str, url: str, headers: dict[str, str], body: bytes | None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, r.headers.get("content-type", "application/octet-stream"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", "application/octet-stream"), e.read()


@router.get("/cors-proxy")
@router.post("/cors-proxy")
async def cors_proxy(ctx: Ctx, request: Request) -> Response:
    if not ctx.cfg.ui_mcp_proxy:
        body = dumps({"error": {"message": "this feature is disabled", "type": "feature_disabled"}})
        return Response(body.encode(), status_code=403, media_type="application/json; charset=utf-8")
    url = request.query_params.get("url", "")
    check_target(url)
    data = await request.body() if request.method == "POST" else None
    ctx.log.srv("I", "proxy_request", f"proxying {request.method} request to {url}")
    try:
        status, ctype, content = await asyncio.to_thread(fetch, request.method, url, forwarded_headers(request), data)
    except (OSError, ValueError) as e:
        raise ApiError(f"proxy request failed: {e}", "server_error", 500) from e
    return Response(content, status_code=status, media_type=ctype)

"""The web chat page at `/` (`--ui` / `--no-ui`, on by default like llama-server).

The page is tritium's own: one HTML, one script and one stylesheet in `api/static/` (package data,
no CDN, works offline). As llama-server (server-http.cpp), the page and its assets are public (no
API key: the page asks for one when the API answers 401) and load while the model is still
loading; `index.html` is revalidated on every load (`Cache-Control: no-cache`, an ETag) and served
with the cross-origin isolation headers. With `--no-ui` these paths answer 404 and `/sw.js` is a
service worker that removes itself (for browsers that kept one from another UI).
"""
from __future__ import annotations

import hashlib
import mimetypes
import os
from functools import lru_cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from api.context import Ctx
from api.errors import not_found

router = APIRouter()

ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "application/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
# the paths the pre-routing middleware lets through without an API key and while loading
FRONTEND_PATHS = frozenset({"/", *("/" + name for name in ASSETS)})

SW_REMOVE_JS = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""


@lru_cache(maxsize=None)
def asset(name: str) -> tuple[bytes, str]:
    """(bytes, ETag) of one packaged asset."""
    data = resources.files("api").joinpath("static", name).read_bytes()
    return data, '"' + hashlib.sha256(data).hexdigest()[:32] + '"'


def static_file(public_path: str, url_path: str) -> FileResponse | None:
    """`--path DIR`: the file under DIR a GET or HEAD of `url_path` names, as cpp-httplib's mount
    point serves it (a path ending in / names its index.html; no way out of DIR), else None."""
    sub = url_path + "index.html" if url_path.endswith("/") else url_path
    parts = [p for p in sub.split("/") if p]
    if any(p in (".", "..") or "\\" in p or "\x00" in p for p in parts):
        return None
    path = os.path.join(public_path, *parts)
    if not os.path.isfile(path):
        return None
    media = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media)


def _serve(ctx: Ctx, request: Request, name: str) -> Response:
    if not ctx.cfg.ui or ctx.cfg.public_path:  # --path replaces the built-in page
        raise not_found()
    data, etag = asset(name)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if name == "index.html":
        headers.update({"Cross-Origin-Embedder-Policy": "require-corp", "Cross-Origin-Opener-Policy": "same-origin"})
    inm = request.headers.get("if-none-match", "")
    if inm in (etag, "W/" + etag):
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=ASSETS[name], headers=headers)


@router.get("/")
async def index(ctx: Ctx, request: Request) -> Response:
    return _serve(ctx, request, "index.html")


@router.get("/index.html")
async def index_html(ctx: Ctx, request: Request) -> Response:
    return _serve(ctx, request, "index.html")


@router.get("/app.js")
async def app_js(ctx: Ctx, request: Request) -> Response:
    return _serve(ctx, request, "app.js")


@router.get("/style.css")
async def style_css(ctx: Ctx, request: Request) -> Response:
    return _serve(ctx, request, "style.css")


@router.get("/sw.js")
async def sw_js(ctx: Ctx) -> Response:
    if ctx.cfg.ui and not ctx.cfg.public_path:  # (a sw.js under --path is served before this route)
        raise not_found()
    return Response(SW_REMOVE_JS, media_type="application/javascript", headers={"Cache-Control": "no-cache"})

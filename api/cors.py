"""CORS as llama-server b1-0c1e570's pre-routing handler writes it (server-http.cpp).

`--cors-origins` is one string, not a list that is matched:
- `*` with `--cors-credentials` (both the defaults): the request's `Origin` is echoed back (an
  absent one as an empty value, as cpp-httplib writes it);
- `localhost`: the `Origin` is echoed only when its host is localhost, 127.0.0.1 or ::1 (any port);
- anything else is sent as it is (`--cors-origins https://a.example` answers every origin with it).
An OPTIONS request (a browser's preflight) is answered before readiness and the API key are checked,
with `Access-Control-Allow-Credentials`, `-Methods` (`--cors-methods`) and `-Headers`
(`--cors-headers`).
"""
from __future__ import annotations

from urllib.parse import urlsplit


def origin_is_localhost(origin: str) -> bool:
    """`origin_is_localhost` of server-http.cpp: an http(s) URL whose host is a loopback name."""
    try:
        u = urlsplit(origin)
        if u.scheme not in ("http", "https"):
            return False
        return (u.hostname or "") in ("localhost", "127.0.0.1", "::1")
    except ValueError:
        return False


def cors_headers(cfg, origin: str | None, preflight: bool) -> dict[str, str]:
    """The CORS headers of a response to a request with this `Origin` (None: no header)."""
    h: dict[str, str] = {}
    if cfg.cors_credentials and cfg.cors_origins == "*":
        h["Access-Control-Allow-Origin"] = origin or ""
    elif cfg.cors_origins == "localhost":
        if origin and origin_is_localhost(origin):
            h["Access-Control-Allow-Origin"] = origin
    else:
        h["Access-Control-Allow-Origin"] = cfg.cors_origins
    if preflight:
        h["Access-Control-Allow-Credentials"] = "true" if cfg.cors_credentials else "false"
        h["Access-Control-Allow-Methods"] = cfg.cors_methods
        h["Access-Control-Allow-Headers"] = cfg.cors_headers
    return h

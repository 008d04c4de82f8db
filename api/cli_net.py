"""The listening and browser-facing flags of `tritium-server`: addresses, CORS, the model's names
and tags, and the agent features that narrow CORS (common/arg.cpp of llama-server b1-0c1e570).

- `--host A,B`: every address is bound (same port); `LLAMA_ARG_HOST` is the default, the flag
  replaces it (the options themselves are in api/cli_opts_server.py).
- `--cors-origins` (default `*`), `--cors-methods`, `--cors-headers`, `--cors-credentials`
  (api/cors.py). `--tools`, `--mcp-servers-config` or `--mcp-servers-json` without an explicit
  `--cors-origins` make it `localhost`, as llama-server does for security.
- `-a/--alias a,b` and `--tags x,y`: sorted sets; the first alias names the model in responses.
- `--ui-mcp-proxy` (or `--agent`): `GET/POST /cors-proxy?url=...` (api/routes/cors_proxy.py).
"""
from __future__ import annotations

import argparse
from typing import Any


def _csv_set(value: str | None) -> list[str]:
    """llama-server's comma-separated sets (std::set: sorted, unique, stripped, no empties)."""
    return sorted({v.strip() for v in (value or "").split(",") if v.strip()})


def hosts(args: argparse.Namespace) -> list[str]:
    return [h.strip() for h in args.host.split(",") if h.strip()] or ["127.0.0.1"]


def net_settings(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig fields of these flags."""
    tools = bool(args.tools) or args.agent
    origins = args.cors_origins
    if origins is None:
        origins = "localhost" if (tools or args.mcp_servers_config or args.mcp_servers_json) else "*"
    # without -a, llama-server names the model by its -hf repository or -m path, as an alias too
    # (server.cpp: "the same model name as alias" for router and single-model mode alike)
    aliases = _csv_set(args.alias) or [n for n in (getattr(args, "hf_repo", None) or args.model,) if n]
    return {
        "host": hosts(args)[0], "hosts": hosts(args),
        "alias": aliases[0] if aliases else None, "aliases": aliases, "tags": _csv_set(args.tags),
        "cors_origins": origins, "cors_methods": args.cors_methods, "cors_headers": args.cors_headers,
        "cors_credentials": args.cors_credentials, "ui_mcp_proxy": args.ui_mcp_proxy or args.agent,
    }


def warnings(args: argparse.Namespace, settings: dict[str, Any]) -> list[str]:
    out = []
    if args.cors_origins is None and settings["cors_origins"] == "localhost":
        out.append("server tools or MCP servers are enabled, using localhost as default CORS origin "
                   "(change via --cors-origins)")
    if args.tools or args.agent or args.mcp_servers_config or args.mcp_servers_json:
        out.append("built-in tools and MCP servers are not supported by tritium: none are served")
    if settings["ui_mcp_proxy"]:
        out.append("security: MCP proxy (experimental) enabled - do not expose to untrusted environments")
    return out

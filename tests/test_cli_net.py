"""api/cli_net.py: llama-server's --host list, -a/--tags sets and the CORS defaults of the flags
(pure parsing, no server)."""
from __future__ import annotations

from api.cli import build_parser, server_config


def cfg(*argv: str):
    return server_config(build_parser().parse_args(list(argv)))


def test_hosts_aliases_tags():
    c = cfg("--host", "127.0.0.1, ::1", "-a", "tinyllama-2,fim,code, fim", "--tags", "chat,fim,small")
    assert c.hosts == ["127.0.0.1", "::1"] and c.host == "127.0.0.1"
    # std::set order: the first alias in sorted order names the model
    assert (c.aliases, c.model_name, c.tags) == (["code", "fim", "tinyllama-2"], "code", ["chat", "fim", "small"])
    assert (cfg().aliases, cfg().tags, cfg().hosts) == ([], [], ["127.0.0.1"])
    # without -a the model's -m path (or -hf repository) is its one alias and its name, as llama-server
    assert (cfg("-m", "/m/x.gguf").aliases, cfg("-m", "/m/x.gguf").model_name) == (["/m/x.gguf"], "/m/x.gguf")
    assert cfg("-hf", "org/repo:Q4_K_M").aliases == ["org/repo:Q4_K_M"]
    assert cfg("-m", "/m/x.gguf", "-a", "b,a").aliases == ["a", "b"]


def test_host_env_is_the_default_and_the_flag_replaces_it(monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_HOST", "192.0.2.1")
    assert cfg().hosts == ["192.0.2.1"]
    assert cfg("--host", "127.0.0.1").hosts == ["127.0.0.1"]


def test_cors_defaults():
    c = cfg()
    assert (c.cors_origins, c.cors_methods, c.cors_headers, c.cors_credentials, c.ui_mcp_proxy) == \
        ("*", "GET, POST, DELETE, OPTIONS", "*", True, False)
    # tools, MCP servers or --agent narrow the default to localhost; an explicit value wins
    assert cfg("--tools", "all").cors_origins == "localhost"
    assert cfg("--mcp-servers-json", "{}").cors_origins == "localhost"
    assert cfg("--agent").cors_origins == "localhost" and cfg("--agent").ui_mcp_proxy
    assert cfg("--tools", "all", "--cors-origins", "*").cors_origins == "*"
    assert cfg("--no-cors-credentials").cors_credentials is False


def test_verbose_responses_follow_the_log_verbosity():
    """b1-0c1e570: a request's `verbose` defaults to log verbosity > 9 (-v sets it to INT_MAX;
    --log-disable only silences the log)."""
    assert [cfg(*a).verbose for a in ([], ["-v"], ["-lv", "10"], ["-lv", "9"], ["-v", "--log-disable"])] == \
        [False, True, True, False, True]

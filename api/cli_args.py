"""`tritium-server`'s command line: llama-server b1-0c1e570's options, parsed as it parses them.

`OPTIONS` is common/arg.cpp's table for the server (api/cli_opts_general.py, cli_opts_model.py,
cli_opts_server.py, cli_opts_spec.py, in arg.cpp's order) plus tritium's own; `build_parser()`
gives an object whose `parse_args(argv)` returns the namespace api/cli.py turns into the server's
and the engine's configs (api/cli_spec.py: the machinery; api/cli_info.py: help, version).

Each option either takes effect, or changes nothing of what is computed here (accepted; its note
says why), or is parsed and refused at start-up where it needs a feature tritium lacks
(`startup_refusal`: the message names it), or is refused as b1-0c1e570 refuses it.
"""
from __future__ import annotations

import argparse
from typing import Any, Mapping

from api import cli_opts_general, cli_opts_model, cli_opts_server, cli_opts_spec
from api.cli_info import completion_bash, help_text, usage
from api.cli_spec import ArgError, CliError, Effect, Exit, Opt, parse, startup_refusal

__all__ = ["OPTIONS", "ArgError", "CliError", "Exit", "build_parser", "startup_refusal", "refusal"]

OPTIONS: list[Opt] = (cli_opts_general.OPTIONS + cli_opts_model.OPTIONS + cli_opts_server.OPTIONS
                      + cli_opts_spec.OPTIONS)
DEFAULTS: dict[str, Any] = {**cli_opts_general.DEFAULTS, **cli_opts_model.DEFAULTS, **cli_opts_server.DEFAULTS,
                            **cli_opts_spec.DEFAULTS}
POOLING = ("none", "mean", "cls", "last", "rank")


class Parser:
    """llama-server's parser over OPTIONS (argparse's interface: `parse_args`)."""

    def __init__(self, options: list[Opt] = OPTIONS):
        self.options = options

    def parse_args(self, argv: list[str] | None = None, environ: Mapping[str, str] | None = None
                   ) -> argparse.Namespace:
        """The namespace of `argv` (and of the LLAMA_ARG_* variables of `environ`, default
        os.environ). Raises ArgError with llama-server's text, or Exit for --help and the like."""
        import os
        import sys

        args = list(sys.argv[1:] if argv is None else argv)
        defaults = {k: (type(v)(v) if isinstance(v, (list, dict, set)) else v) for k, v in DEFAULTS.items()}
        ns = parse(self.options, args, os.environ if environ is None else environ, defaults, usage)
        if ns.usage:
            raise Exit(0, stdout=help_text(self.options))
        if ns.completion:
            raise Exit(0, stdout=completion_bash(self.options))
        return ns

    def format_help(self) -> str:
        return help_text(self.options)


def build_parser() -> Parser:
    return Parser()


def refusal(ns: argparse.Namespace) -> ArgError | None:
    """The first option given whose value needs a feature tritium does not have (start-up)."""
    return startup_refusal(OPTIONS, ns)


def by_spelling() -> dict[str, Opt]:
    return {a: o for o in OPTIONS for a in o.spellings}


def effects() -> dict[Effect, list[Opt]]:
    out: dict[Effect, list[Opt]] = {e: [] for e in Effect}
    for o in OPTIONS:
        out[o.effect].append(o)
    return out

"""Command lines of a router's workers, from option dicts (llama-server's `common_preset`).

A preset (runtime/launch/model_sources.py) holds `{key: value}` with keys made canonical here:
an option's last spelling without dashes as b1's (`model`, `hf-repo`, `ctx-size`, `temperature`), a switch
as `"true"`/`"false"` under its positive spelling (`no-jinja = 1` is `jinja = false`, as b1's
parse_bool_arg). `OptionTable` is built from llama-server's option table (api/cli_args.py OPTIONS),
so every flag the server takes is a preset key too; `LLAMA_ARG_*` names are read as the option
whose environment variable they are (b1's get_map_key_opt).
"""
from __future__ import annotations

from api.cli_spec import Kind, Opt, is_falsey

__all__ = ["OptionTable", "RESERVED", "MODEL_KEYS"]

# the router's own options, never passed to a worker (server-models.cpp unset_reserved_args)
RESERVED = ("ssl-key-file", "ssl-cert-file", "api-key", "api-key-file", "models-dir", "models-max",
            "models-preset", "models-autoload", "log-file")
# a model's identity: taken from its preset, never from the router's command line
MODEL_KEYS = ("model", "mmproj", "alias", "hf-repo", "hf-file")
_TRUE = ("1", "true", "on", "yes", "enabled")


def _key(o: Opt) -> str:
    return o.args[-1].lstrip("-")  # b1: opt.args.back(), without its dashes


def _switch(o: Opt) -> bool:
    return o.kind in (Kind.VOID, Kind.BOOL)


class OptionTable:
    """Every spelling (and environment variable) of an option table -> (canonical key, its Opt, negated?)."""

    def __init__(self, options: list[Opt]):
        self.by_string: dict[str, tuple[str, Opt, bool]] = {}
        self.by_env: dict[str, tuple[str, Opt, bool]] = {}
        self.by_key: dict[str, Opt] = {}
        for o in options:
            k = _key(o)
            self.by_key.setdefault(k, o)
            for s in o.args:
                self.by_string.setdefault(s, (k, o, False))
            for s in o.neg:
                self.by_string.setdefault(s, (k, o, True))
            for i, env in enumerate(o.env_names()):
                self.by_env.setdefault(env, (k, o, i == 1))  # LLAMA_ARG_NO_X: the negation

    def lookup(self, key: str) -> tuple[str, Opt, bool] | None:
        """A preset key (`ctx-size`, `c`, `no-jinja`, `LLAMA_ARG_CTX_SIZE`) -> its entry."""
        if key in self.by_env:
            return self.by_env[key]
        for s in ("--" + key, "-" + key):
            if s in self.by_string:
                return self.by_string[s]
        return None

    def canon(self, key: str, value: str) -> tuple[str, str] | None:
        hit = self.lookup(key)
        if hit is None:
            return None
        k, o, negated = hit
        if _switch(o):
            on = value.strip().lower() in _TRUE
            return k, "true" if on != negated else "false"
        return k, value

    def options_of_argv(self, argv: list[str]) -> dict[str, str]:
        """The router's command line as preset options (its last value wins; list-valued flags
        such as --lora keep only their last value, as a preset keeps one per key; an option with
        two values is left out, as b1's common_preset::to_args cannot pass it on)."""
        out: dict[str, str] = {}
        i = 0
        while i < len(argv):
            tok = argv[i]
            i += 1
            name, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
            if name.startswith("--"):
                name = name.replace("_", "-")  # b1: --a_b is --a-b
            hit = self.by_string.get(name)
            if hit is None:
                continue
            k, o, negated = hit
            if _switch(o):
                out[k] = "false" if negated else "true"
            elif o.kind is Kind.STR_STR:
                i += 2
            elif eq:
                out[k] = inline
            elif i < len(argv):
                out[k] = argv[i]
                i += 1
        return out

    def render(self, options: dict[str, str]) -> list[str]:
        """Worker arguments for preset options (a switch set false: its negation, or nothing)."""
        args: list[str] = []
        for k, v in options.items():
            o = self.by_key.get(k)
            if o is None or o.kind is Kind.STR_STR:
                continue
            spelling = o.args[-1]
            if not _switch(o):
                args += [spelling, v]
            elif not is_falsey(v.strip().lower()):  # b1: a falsey value is the negation, or nothing
                args.append(spelling)
            elif o.neg:
                args.append(o.neg[-1])
        return args

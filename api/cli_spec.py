"""llama-server's command-line machinery (common/arg.cpp of b1-0c1e570), as plain data and functions.

An `Opt` is one `common_arg`: its spellings, negated spellings, value hint(s), environment
variable, handler kind and handler, plus what it does in tritium (`Effect`). The tables are in
api/cli_opts_*.py, in arg.cpp's order; `parse` is `common_params_parse_ex`:

1. every option whose environment variable is set is applied, in table order (a void option when
   the value is truthy, an int one through `stoi`, a bool one through `parse_bool_value`;
   `LLAMA_ARG_NO_X` is `LLAMA_ARG_X=0` for options with negated spellings);
2. the command line, left to right: `--a_b` is `--a-b`, an unknown spelling is
   `error: invalid argument: X`, a handler's error is `error while handling argument "X": ...`
   followed by the option's usage; a repeated spelling warns (`--spec-type` excepted).

Errors are `ArgError`s whose text is llama-server's; `Exit` carries what an option that prints and
exits (`--help`, `--version`, ...) prints. Handlers raise `Invalid(what)` as llama.cpp's throw
`std::invalid_argument(what)`; `stoi`, `stof`, `stoul`, `stoull`, `stod` behave as libstdc++'s
(a numeric prefix is enough; no digits or out of range: the function's name).
"""
from __future__ import annotations

import argparse
import enum
import math
import os
import re
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping


class Kind(enum.Enum):
    """The handler's signature (which common_arg constructor)."""
    VOID = "void"
    INT = "int"
    STRING = "string"
    BOOL = "bool"
    STR_STR = "str_str"


class Effect(enum.Enum):
    """What an option does in tritium."""
    APPLIES = "applies"        # takes effect as in llama-server
    NO_EFFECT = "no effect"    # parsed and checked; what is computed is the same without it (Opt.note says why)
    PENDING = "pending"        # parsed; start-up refuses the values that need a feature tritium lacks
    REMOVED = "removed"        # b1-0c1e570 itself refuses it ("the argument has been removed. ...")
    EXIT = "exit"              # prints something and exits


class Section(enum.Enum):
    """The --help section (common_params_print_usage)."""
    COMMON = "common params"
    SAMPLING = "sampling params"
    SPEC = "speculative params"
    SERVER = "example-specific params"
    TRITIUM = "tritium params"


class Invalid(Exception):
    """A handler's error (std::invalid_argument / std::runtime_error); str() is its what()."""


class Exit(Exception):
    """An option that prints and exits (--help, --version, --list-devices, ...)."""

    def __init__(self, code: int = 0, stdout: str = "", stderr: str = ""):
        super().__init__(code)
        self.code, self.stdout, self.stderr = code, stdout, stderr


class ArgError(Exception):
    """A refused command line; str() is what llama-server prints (stderr, exit status 1)."""

    def __init__(self, flag: str, message: str, usage: str | None = None):
        text = f'error while handling argument "{flag}": {message}'
        if usage is not None:
            text += f"\n\nusage:\n{usage}\n\nto show complete usage, run with -h"
        super().__init__(text)
        self.flag = flag


class CliError(ArgError):
    """Any other refusal, its text as is (`error: invalid argument: X`, environment variables)."""

    def __init__(self, text: str):
        Exception.__init__(self, text)
        self.flag = ""


Handler = Callable[..., None]
Startup = Callable[[argparse.Namespace], "str | None"]


@dataclass(frozen=True)
class Opt:
    args: tuple[str, ...]
    kind: Kind
    handler: Handler
    hint: str | None = None
    hint2: str | None = None
    neg: tuple[str, ...] = ()
    env: str | None = None
    effect: Effect = Effect.APPLIES
    note: str = ""             # NO_EFFECT: why; PENDING: the missing feature; tritium options: their help
    section: Section = Section.COMMON
    # start-up check (after the whole command line): a message naming what is not supported, or None
    startup: Startup | None = None

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.args + self.neg

    def env_names(self) -> list[str]:
        if not self.env:
            return []
        return [self.env] + ([self.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")] if self.neg else [])

    def env_value(self, environ: Mapping[str, str]) -> str | None:
        """common_arg::get_value_from_env: LLAMA_ARG_NO_X (options with negations) reads as "0"."""
        if not self.env:
            return None
        if self.neg and self.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") in environ:
            return "0"
        return environ.get(self.env)


def opt(args: Iterable[str], hint: str | None = None, handler: Handler | None = None, *, kind: Kind | None = None,
        hint2: str | None = None, neg: Iterable[str] = (), env: str | None = None, effect: Effect = Effect.APPLIES,
        note: str = "", section: Section = Section.COMMON, startup: Startup | None = None) -> Opt:
    """An Opt; the kind follows from the arguments as common_arg's constructors do (negated
    spellings: bool, no hint: void, two hints: two strings, else a string unless `kind=Kind.INT`)."""
    neg = tuple(neg)
    if kind is None:
        kind = Kind.BOOL if neg else Kind.VOID if hint is None else Kind.STR_STR if hint2 else Kind.STRING
    assert handler is not None
    return Opt(tuple(args), kind, handler, hint, hint2, neg, env, effect, note, section, startup)


# ---- handler helpers ---------------------------------------------------------------------------

def store(dest: str, conv: Callable[[Any], Any] | None = None) -> Handler:
    """A handler that sets `dest` to the value (converted)."""
    def h(ns: argparse.Namespace, value: Any) -> None:
        setattr(ns, dest, conv(value) if conv is not None else value)
    return h


def const(dest: str, value: Any = True) -> Handler:
    def h(ns: argparse.Namespace) -> None:
        setattr(ns, dest, value)
    return h


def nothing(ns: argparse.Namespace, *values: Any) -> None:
    """A handler with no effect of its own (the value checks are in `conv`)."""


def checked(check: Callable[[Any], Any], dest: str | None = None) -> Handler:
    """A handler that runs `check(value)` (raising Invalid) and stores its result in `dest` if given."""
    def h(ns: argparse.Namespace, value: Any) -> None:
        out = check(value)
        if dest is not None:
            setattr(ns, dest, out)
    return h


def warn(text: str) -> None:
    """A warning printed while parsing as is (fprintf(stderr) in arg.cpp)."""
    sys.stderr.write(text)
    sys.stderr.flush()


_T0 = time.monotonic()


def log_line(level: str, text: str, func: str | None = None) -> str:
    """A common_log line: the time since start (m.ss.mmm.uuu), the level, for COM_* lines the
    component and function (12 characters), then the text (LOG_WRN, COM_ERR in arg.cpp)."""
    t = int((time.monotonic() - _T0) * 1e6)
    stamp = f"{t // 60_000_000}.{t // 1_000_000 % 60:02d}.{t // 1000 % 1000:03d}.{t % 1000:03d}"
    return f"{stamp} {level} " + (f"cmn  {func[:12]:>12}: " if func else "") + text


def log_warn(text: str) -> None:
    warn(log_line("W", text))


def log_err(func: str, text: str) -> None:
    warn(log_line("E", text, func))


# ---- libstdc++'s conversions -------------------------------------------------------------------

_WS = " \t\n\v\f\r"
_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_FLOAT = re.compile(r"""[ \t\n\v\f\r]*([+-]?(?:
    0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)? |
    (?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)? |
    inf(?:inity)? | nan(?:\([0-9A-Za-z_]*\))? ))""", re.X | re.I)


def _int(value: str, name: str, lo: int, hi: int) -> int:
    m = _INT.match(value)
    if m is None:
        raise Invalid(name)
    v = int(m.group(1))
    if v < lo or v > hi:
        raise Invalid(name)
    return v


def stoi(value: str) -> int:
    return _int(value, "stoi", -(1 << 31), (1 << 31) - 1)


def stoul(value: str) -> int:
    """strtoul: a leading minus wraps around (-1 is ULONG_MAX)."""
    m = _INT.match(value)
    if m is None:
        raise Invalid("stoul")
    v = int(m.group(1))
    if abs(v) >= 1 << 64:
        raise Invalid("stoul")
    return v % (1 << 64)


def stoull(value: str) -> int:
    m = _INT.match(value)
    if m is None:
        raise Invalid("stoull")
    v = int(m.group(1))
    if abs(v) >= 1 << 64:
        raise Invalid("stoull")
    return v % (1 << 64)


def _float_prefix(value: str, name: str) -> tuple[float, int]:
    m = _FLOAT.match(value)
    if m is None:
        raise Invalid(name)
    text = m.group(1)
    low = text.lower().lstrip("+-")
    if low.startswith("inf"):
        v = math.inf
    elif low.startswith("nan"):
        v = math.nan
    elif low.startswith("0x"):
        v = float.fromhex(text)
    else:
        v = float(text)
    if text.startswith("-"):
        v = -abs(v)
    return v, m.end()


def stof(value: str) -> float:
    """std::stof: a float32 (ERANGE on overflow or underflow: out_of_range)."""
    v, _ = _float_prefix(value, "stof")
    if math.isfinite(v) and v != 0.0:
        try:
            f = struct.unpack("f", struct.pack("f", v))[0]
        except OverflowError:
            raise Invalid("stof") from None
        if math.isinf(f) or abs(f) < 1.1754943508222875e-38:  # beyond FLT_MAX or below FLT_MIN: ERANGE
            raise Invalid("stof")
        return f
    return v


def stod(value: str) -> tuple[float, int]:
    """std::stod with the position after the number (std::stod(text, &pos))."""
    v, end = _float_prefix(value, "stod")
    if math.isfinite(v) and v != 0.0 and (abs(v) < 2.2250738585072014e-308 or math.isinf(v)):
        raise Invalid("stod")
    return v, end


def is_truthy(v: str) -> bool:
    return v in ("on", "enabled", "true", "1")


def is_falsey(v: str) -> bool:
    return v in ("off", "disabled", "false", "0")


def is_autoy(v: str) -> bool:
    return v in ("auto", "-1")


def parse_bool_value(v: str) -> bool:
    if is_truthy(v):
        return True
    if is_falsey(v):
        return False
    raise Invalid("invalid boolean value")


def parse_csv_row(text: str) -> list[str]:
    """common/arg.cpp's parse_csv_row: commas split, double quotes group, "" is a quote."""
    fields: list[str] = []
    field, in_quotes, i = "", False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if not in_quotes:
                if field:
                    field += '"'
                else:
                    in_quotes = True
            elif i + 1 < len(text) and text[i + 1] == '"':
                field += '"'
                i += 1
            else:
                in_quotes = False
        elif ch == "," and not in_quotes:
            fields.append(field)
            field = ""
        else:
            field += ch
        i += 1
    fields.append(field)
    return fields


def string_split(text: str, sep: str) -> list[str]:
    """common's string_split<std::string>: every piece, empty ones too ("" gives [""])."""
    return text.split(sep)


def string_strip(text: str) -> str:
    return text.strip(_WS)


# ---- parsing -----------------------------------------------------------------------------------

def _call(o: Opt, ns: argparse.Namespace, value: Any) -> None:
    if o.kind is Kind.VOID:
        o.handler(ns)
    else:
        o.handler(ns, value)


def parse(options: list[Opt], argv: list[str], environ: Mapping[str, str], defaults: dict[str, Any],
          usage: Callable[[Opt], str]) -> argparse.Namespace:
    """common_params_parse_ex over `options` (see the module doc). Raises ArgError or Exit."""
    ns = argparse.Namespace(**defaults)
    ns.given = set()  # first spellings of the options the command line or the environment gave
    by_name: dict[str, tuple[Opt, bool]] = {}
    for o in options:
        for a in o.args:
            by_name[a] = (o, True)
        for a in o.neg:
            by_name[a] = (o, False)
    for o in options:  # the environment first, in table order
        value = o.env_value(environ)
        if value is None:
            continue
        try:
            if o.kind is Kind.VOID:
                if not is_truthy(value):
                    continue
                o.handler(ns)
            elif o.kind is Kind.INT:
                o.handler(ns, stoi(value))
            elif o.kind is Kind.BOOL:
                o.handler(ns, parse_bool_value(value))
            else:
                o.handler(ns, value)
            ns.given.add(o.args[0])
        except Invalid as e:
            raise CliError(f'error while handling environment variable "{o.env}": {e}\n\n') from None
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
        if arg not in by_name:
            raise CliError(f"error: invalid argument: {arg}")
        if arg in seen and arg != "--spec-type":
            log_warn(f"DEPRECATED: argument '{arg}' specified multiple times, use comma-separated values instead "
                     f"(only last value will be used)\n")
        seen.add(arg)
        o, positive = by_name[arg]
        if o.env and any(n in environ for n in o.env_names()):
            warn(f"warn: {o.env} environment variable is set, but will be overwritten by command line argument {arg}\n")
        try:
            if o.kind is Kind.VOID:
                o.handler(ns)
            elif o.kind is Kind.BOOL:
                o.handler(ns, positive)
            else:
                if i + 1 >= len(argv):
                    raise Invalid("expected value for argument")
                i += 1
                value = argv[i]
                if o.kind is Kind.INT:
                    o.handler(ns, stoi(value))
                elif o.kind is Kind.STRING:
                    o.handler(ns, value)
                else:
                    if i + 1 >= len(argv):
                        raise Invalid("expected value for argument")
                    i += 1
                    o.handler(ns, value, argv[i])
        except Invalid as e:
            raise ArgError(arg, str(e), usage(o)) from None
        ns.given.add(o.args[0])
        i += 1
    return ns


def startup_refusal(options: list[Opt], ns: argparse.Namespace) -> ArgError | None:
    """The first option whose start-up check names something tritium does not support."""
    for o in options:
        if o.startup is not None and o.args[0] in ns.given:
            msg = o.startup(ns)
            if msg:
                return ArgError(o.args[-1] if len(o.args) > 1 else o.args[0], msg)
    return None


# ---- usage text (common_arg::to_string) ----------------------------------------------------------

def _break_lines(text: str, width: int) -> list[str]:
    out: list[str] = []
    lines = text.split("\n") if text else []
    if text.endswith("\n"):
        lines.pop()  # std::getline reads no empty line after the last newline
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        cur = ""
        for word in line.split():
            if len(cur) + (1 if cur else 0) + len(word) > width:
                if cur:
                    out.append(cur)
                cur = word
            else:
                cur = f"{cur} {word}" if cur else word
        if cur:
            out.append(cur)
    return out


def render_usage(o: Opt, help_text: str) -> str:
    """common_arg::to_string: spellings and hints, then the help wrapped at 70 columns from column 40."""
    names = list(o.spellings)
    head = ""
    for k, a in enumerate(names):
        if k == 0:
            head += a if len(names) == 1 else (a + ", ").ljust(7)
        else:
            head += a + (", " if k < len(names) - 1 else "")
    for h in (o.hint, o.hint2):
        if h:
            head += " " + h
    pad = " " * 40
    head = head + "\n" + pad if len(head) > 37 else head.ljust(40)
    lines = _break_lines(help_text, 70) or [""]
    return head + "".join((pad if k else "") + line + "\n" for k, line in enumerate(lines))


def environ_default() -> Mapping[str, str]:
    return os.environ

"""Extract llama-server's command-line table from llama.cpp's common/arg.cpp into JSON.

    python scripts/extract_llama_args.py [LLAMA_CPP_DIR] [--help-from BINARY] [--out tests/data/llama_server_args.json]

LLAMA_CPP_DIR: the llama.cpp tree of b1-0c1e570 (default: the one vendored in llama-cpp-python
0.3.36's sdist under /work/lsb/src, or $LLAMA_CPP_DIR). Every `add_opt(common_arg(...))` of
`common_params_parser_init` is read: its spellings, negated spellings, value hints, environment
variable, examples, excludes, sampling/speculative/preset-only marks, handler kind (void, int,
string, bool, two strings) and the handler's source (for review). `server` is whether
`add_opt` registers it for LLAMA_EXAMPLE_SERVER (the `if (ex == LLAMA_EXAMPLE_SERVER)` branch
counts, its `else` does not). `--help-from BINARY` runs the real binary's `--help`: its text is
written verbatim to api/llama_server_help.txt (tritium's --help and its usage blocks after an
error print it, api/cli_info.py) and each option's block is kept as `help_rendered`; without it
the previous file's rendered texts are kept.

The output is kept in the repository (tests/data/llama_server_args.json) so the tests need
neither the sdist nor the binary; api/cli_table.py reads it at run time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

DEFAULT_DIR = "/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "llama_server_args.json"
HELP_OUT = ROOT / "api" / "llama_server_help.txt"

_TOKEN = re.compile(r'''
    (?P<ws>\s+) | (?P<comment>//[^\n]*|/\*.*?\*/) |
    (?P<str>(?:u8|L|u|U)?"(?:\\.|[^"\\])*") | (?P<rawstr>R"(?P<delim>[^(]*)\(.*?\)(?P=delim)") |
    (?P<chr>'(?:\\.|[^'\\])*') | (?P<id>[A-Za-z_][A-Za-z_0-9]*) | (?P<num>[0-9][0-9a-zA-Z_.']*) |
    (?P<punct>::|->|&&|\|\||==|!=|<=|>=|<<|>>|\+\+|--|[^\s])''', re.S | re.X)


def tokens(src: str) -> list[tuple[str, str, int]]:
    """(kind, text, offset) of C++ source, comments and whitespace dropped."""
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise ValueError(f"cannot lex at {pos}: {src[pos:pos + 40]!r}")
        kind = m.lastgroup if m.lastgroup != "delim" else "rawstr"
        if kind not in ("ws", "comment"):
            out.append((kind, m.group(0), pos))
        pos = m.end()
    return out


_ESC = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r", "0": "\0"}


def c_string(tok: str) -> str:
    if tok.startswith('R"'):
        delim = tok[2:tok.index("(")]
        return tok[len(delim) + 3:-len(delim) - 2]
    body = tok[tok.index('"') + 1:-1]
    return re.sub(r"\\(.)", lambda m: _ESC.get(m.group(1), m.group(1)), body)


def matching(toks, i: int) -> int:
    """Index of the bracket closing toks[i]."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for j in range(i, len(toks)):
        t = toks[j][1]
        if toks[j][0] == "punct" and t in pairs:
            stack.append(pairs[t])
        elif toks[j][0] == "punct" and stack and t == stack[-1]:
            stack.pop()
            if not stack:
                return j
    raise ValueError("unbalanced")


def split_args(toks, lo: int, hi: int) -> list[tuple[int, int]]:
    """Top-level comma-separated ranges of toks[lo:hi]."""
    parts, depth, start = [], 0, lo
    for j in range(lo, hi):
        t = toks[j]
        if t[0] == "punct" and t[1] in "({[":
            depth += 1
        elif t[0] == "punct" and t[1] in ")}]":
            depth -= 1
        elif t[0] == "punct" and t[1] == "," and depth == 0:
            parts.append((start, j))
            start = j + 1
    parts.append((start, hi))
    return parts


def string_list(toks, lo, hi) -> list[str] | None:
    if toks[lo][1] != "{" or toks[hi - 1][1] != "}":
        return None
    return [c_string(toks[a][1]) for a, b in split_args(toks, lo + 1, hi - 1) if b > a]


def literal(toks, lo, hi) -> str | None:
    """A value hint: a string literal (adjacent ones concatenated) or nullptr (None)."""
    if all(t[0] in ("str", "rawstr") for t in toks[lo:hi]):
        return "".join(c_string(t[1]) for t in toks[lo:hi])
    return None


def help_text(src: str, toks, lo, hi) -> str:
    """The help expression: its text when it is plain literals, else the C++ source."""
    lit = literal(toks, lo, hi)
    return lit if lit is not None else src[toks[lo][2]:toks[hi - 1][2] + len(toks[hi - 1][1])]


def handler_kind(toks, lo, hi) -> str:
    """void / int / string / bool / str_str, from the lambda's parameter list."""
    i = next(j for j in range(lo, hi) if toks[j][1] == "(")
    params = split_args(toks, i + 1, matching(toks, i))
    if len(params) == 1:
        return "void"
    if len(params) == 3:
        return "str_str"
    ptoks = [t[1] for t in toks[params[1][0]:params[1][1]]]
    return {"int": "int", "bool": "bool"}.get(ptoks[0], "string")


def server_only_ranges(toks) -> list[tuple[int, int, bool]]:
    """(lo, hi, included) of `if (ex == LLAMA_EXAMPLE_SERVER) {...} else {...}` branches."""
    out = []
    for j in range(len(toks) - 6):
        if [t[1] for t in toks[j:j + 6]] == ["if", "(", "ex", "==", "LLAMA_EXAMPLE_SERVER", ")"] and toks[j + 6][1] == "{":
            end = matching(toks, j + 6)
            out.append((j + 6, end, True))
            if toks[end + 1][1] == "else" and toks[end + 2][1] == "{":
                out.append((end + 2, matching(toks, end + 2), False))
    return out


def extract(src: str) -> list[dict]:
    # static std::initializer_list<enum llama_example> mmproj_examples = {...};
    named_lists = {m.group(1): re.findall(r"LLAMA_EXAMPLE_\w+", m.group(2)) for m in re.finditer(
        r"static\s+std::initializer_list<enum llama_example>\s+(\w+)\s*=\s*\{([^}]*)\}", src)}
    start = src.index("common_params_context common_params_parser_init(")
    toks = [t for t in tokens(src) if t[2] >= start]
    branches = server_only_ranges(toks)
    options = []
    j = 0
    while j < len(toks) - 3:
        if not (toks[j][1] == "add_opt" and toks[j + 1][1] == "(" and toks[j + 2][1] == "common_arg"):
            j += 1
            continue
        close_outer = matching(toks, j + 1)
        ca_open = j + 3
        ca_close = matching(toks, ca_open)
        parts = split_args(toks, ca_open + 1, ca_close)
        args = string_list(toks, *parts[0])
        opt = {"args": args, "args_neg": [], "value_hint": None, "value_hint_2": None, "env": None,
               "examples": ["LLAMA_EXAMPLE_COMMON"], "excludes": [], "sampling": False, "spec": False,
               "preset_only": False, "line": src.count("\n", 0, toks[j][2]) + 1}
        rest = parts[1:]
        neg = string_list(toks, *rest[0])
        if neg is not None:
            opt["args_neg"] = neg
            rest = rest[1:]
        # rest: [hint, [hint2,]] help, handler
        hints = rest[:-2]
        for key, (a, b) in zip(("value_hint", "value_hint_2"), hints):
            opt[key] = literal(toks, a, b)
            if opt[key] is None and toks[a][1] != "nullptr":  # an expression, e.g. common_speculative_all_types_str()
                opt[key + "_expr"] = src[toks[a][2]:toks[b - 1][2] + len(toks[b - 1][1])]
        opt["help"] = help_text(src, toks, *rest[-2])
        opt["handler"] = handler_kind(toks, *rest[-1])
        a, b = rest[-1]
        opt["handler_src"] = src[toks[a][2]:toks[b - 1][2] + 1]
        # chained setters between ca_close and close_outer
        k = ca_close + 1
        while k < close_outer:
            if toks[k][1] == "." and toks[k + 1][0] == "id":
                name, p_open = toks[k + 1][1], k + 2
                p_close = matching(toks, p_open)
                inner = toks[p_open + 1:p_close]
                if name == "set_env":
                    opt["env"] = c_string(inner[0][1]) if inner[0][0] == "str" else inner[0][1]
                elif name in ("set_examples", "set_excludes"):
                    vals = [t[1] for t in inner if t[0] == "id"]
                    if len(vals) == 1 and vals[0] in named_lists:  # set_examples(mmproj_examples)
                        vals = named_lists[vals[0]]
                    opt["examples" if name == "set_examples" else "excludes"] = vals
                elif name == "set_sampling":
                    opt["sampling"] = True
                elif name == "set_spec":
                    opt["spec"] = True
                elif name == "set_preset_only":
                    opt["preset_only"] = True
                k = p_close + 1
            else:
                k += 1
        in_ex = ("LLAMA_EXAMPLE_SERVER" in opt["examples"] or "LLAMA_EXAMPLE_COMMON" in opt["examples"])
        server = in_ex and "LLAMA_EXAMPLE_SERVER" not in opt["excludes"]
        for lo, hi, included in branches:
            if lo < j < hi:
                server = server and included
        opt["server"] = server
        options.append(opt)
        j = close_outer + 1
    return options


def help_blocks(text: str) -> dict[str, str]:
    """First spelling -> the option's block of `llama-server --help` (its usage, defaults filled in)."""
    out: dict[str, str] = {}
    key, lines = None, []
    for line in text.splitlines() + [""]:
        if line.startswith("-") and not line.startswith("-----"):
            if key is not None:
                out[key] = "\n".join(lines) + "\n"
            key, lines = re.split(r"[ ,]", line, maxsplit=1)[0], [line]
        elif line.startswith(" ") and key is not None:
            lines.append(line)
        elif key is not None:
            out[key] = "\n".join(lines) + "\n"
            key, lines = None, []
    return out


def binary_help(binary: str) -> str:
    """`BINARY --help` (stdout; the log lines of the backends' loading go to stderr)."""
    return subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_cpp_dir", nargs="?", default=os.environ.get("LLAMA_CPP_DIR", DEFAULT_DIR))
    ap.add_argument("--help-from", default=None, metavar="BINARY", help="llama-server whose --help fills help_rendered")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    src = (Path(a.llama_cpp_dir) / "common" / "arg.cpp").read_text(encoding="utf-8")
    options = extract(src)
    old = {}
    if Path(a.out).exists():
        old = {o["args"][0]: o.get("help_rendered") for o in json.loads(Path(a.out).read_text())["options"]}
    helps = {}
    if a.help_from:
        text = binary_help(a.help_from)
        HELP_OUT.write_text(text, encoding="utf-8")
        helps = help_blocks(text)
    for o in options:
        r = helps.get(o["args"][0]) if a.help_from else old.get(o["args"][0])
        if r is not None and o["server"]:
            o["help_rendered"] = r
    doc = {"source": "llama.cpp b1-0c1e570 common/arg.cpp (llama-cpp-python 0.3.36 sdist)",
           "generator": "scripts/extract_llama_args.py", "options": options}
    Path(a.out).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n_server = sum(o["server"] for o in options)
    n_spell = sum(len(o["args"]) + len(o["args_neg"]) for o in options if o["server"])
    print(f"{len(options)} options, {n_server} registered for llama-server ({n_spell} spellings) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

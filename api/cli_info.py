"""What the options that print and exit print: `--version`, `--help`, `--completion-bash`,
`--cache-list`, and each option's usage block (the text llama-server prints after an error).

llama-server's own help text (its `--help` output, defaults filled in) is kept in
`api/llama_server_help.txt`, written by scripts/extract_llama_args.py from the reference binary;
tritium's `--help` is that text with a note under each option that does not take effect here,
then tritium's own options.
"""
from __future__ import annotations

import os
import platform
import re
import sys
from functools import lru_cache
from pathlib import Path

from api.cli_spec import Effect, Opt, Section, _break_lines, render_usage

BUILD_INFO = "b1-tritium"  # /props build_info: llama.cpp's "b<build>-<commit>" shape
VERSION = "0.1.0"
HELP_FILE = Path(__file__).with_name("llama_server_help.txt")


def version_text() -> str:
    """`--version` (llama_print_build_info: stderr, two lines)."""
    build, commit = BUILD_INFO[1:].split("-", 1)
    return (f"version: {VERSION} (build {build}, commit {commit})\n"
            f"built with Python {platform.python_version()} for {platform.system()} {platform.machine()}\n")


@lru_cache(maxsize=1)
def llama_help() -> tuple[list[str], dict[str, str]]:
    """(the help text's lines, first spelling -> that option's usage block)."""
    try:
        lines = HELP_FILE.read_text(encoding="utf-8").splitlines()
    except OSError:
        return [], {}
    blocks: dict[str, str] = {}
    key, cur = None, []
    for line in lines + [""]:
        if line.startswith("-") and not line.startswith("-----"):
            if key is not None:
                blocks[key] = "\n".join(cur) + "\n"
            key, cur = re.split(r"[ ,]", line, maxsplit=1)[0], [line]
        elif line.startswith(" ") and key is not None:
            cur.append(line)
        elif key is not None:
            blocks[key] = "\n".join(cur) + "\n"
            key, cur = None, []
    return lines, blocks


def usage(o: Opt) -> str:
    """The option's usage block (common_arg::to_string), as llama-server prints it."""
    block = llama_help()[1].get(o.args[0])
    return block if block is not None else render_usage(o, o.note)


def _note(o: Opt) -> list[str]:
    """tritium's note under an option's help, wrapped as llama-server wraps help (70 columns)."""
    if o.effect is Effect.NO_EFFECT:
        text = f"[tritium: accepted, no effect: {o.note}]"
    elif o.effect is Effect.PENDING:
        text = f"[tritium: not supported yet: {o.note}; the server refuses to start with it]"
    elif o.effect is Effect.APPLIES and o.note:
        text = f"[tritium: {o.note}]"
    else:
        return []
    return [" " * 40 + line for line in _break_lines(text, 70)]


def help_text(options: list[Opt]) -> str:
    """`--help`: llama-server's text with tritium's notes, then tritium's own options."""
    lines, _ = llama_help()
    if not lines:  # no copy of llama-server's text: every option of the table, without its help
        lines = "".join(render_usage(o, "") for o in options if o.section is not Section.TRITIUM).splitlines()
    by_first = {o.args[0]: o for o in options}
    out: list[str] = []
    pending: list[str] = []
    for line in lines + [""]:
        starts = line.startswith("-") and not line.startswith("-----")
        if starts or not line.startswith(" "):
            out += pending
            pending = []
        if starts:
            o = by_first.get(re.split(r"[ ,]", line, maxsplit=1)[0])
            pending = _note(o) if o is not None else []
        out.append(line)
    while out and out[-1] == "":
        out.pop()
    text = "\n".join(out) + "\n" if out else ""
    own = [o for o in options if o.section is Section.TRITIUM]
    return text + "\n\n----- tritium params -----\n\n" + "".join(render_usage(o, o.note) for o in own)


def completion_bash(options: list[Opt]) -> str:
    """`--completion-bash` (common_params_print_completion), for tritium-server."""
    order = ([o for o in options if o.section is Section.COMMON] + [o for o in options if o.section is Section.SAMPLING]
             + [o for o in options if o.section is Section.SPEC]
             + [o for o in options if o.section in (Section.SERVER, Section.TRITIUM)])
    opts = "".join(f"{a} " for o in order for a in o.args)
    cases = "".join(
        f"        {flags})\n            COMPREPLY=( $(compgen -f -X '!*.{ext}' -- \"$cur\") $(compgen -d -- \"$cur\") )\n"
        f"            return 0\n            ;;\n"
        for flags, ext in (("--model|-m", "gguf"), ("--grammar-file", "gbnf"), ("--chat-template-file", "jinja")))
    return ("_llama_completions() {\n    local cur prev opts\n    COMPREPLY=()\n"
            "    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n\n"
            f"    opts=\"{opts}\"\n\n    case \"$prev\" in\n{cases}"
            "        *)\n            COMPREPLY=( $(compgen -W \"${opts}\" -- \"$cur\") )\n            return 0\n"
            "            ;;\n    esac\n}\n\ncomplete -F _llama_completions tritium-server\n")


def cached_models() -> list[str]:
    """`--cache-list`: the GGUF files of the Hugging Face cache -hf downloads into, as repo:file."""
    root = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    out = []
    try:
        repos = sorted(os.listdir(root))
    except OSError:
        return []
    for d in repos:
        if not d.startswith("models--"):
            continue
        repo = d[len("models--"):].replace("--", "/")
        for dirpath, _, files in os.walk(os.path.join(root, d, "snapshots")):
            out += [f"{repo}:{f}" for f in sorted(files) if f.endswith(".gguf")]
    return out


def write(text: str, stream=None) -> None:
    (stream or sys.stdout).write(text)
    (stream or sys.stdout).flush()


def markdown_table(options: list[Opt]) -> str:
    """The README's flag table: llama-server's options grouped by what they do in tritium (first
    spelling of each), the same text the README carries (tests/test_cli_args.py checks it)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for o in options:
        if o.section is Section.TRITIUM:
            continue
        if o.effect is Effect.APPLIES:
            key = ("takes effect", "")
        elif o.effect is Effect.EXIT:
            key = ("prints and exits", "")
        elif o.effect is Effect.NO_EFFECT:
            key = ("accepted, no effect", o.note)
        elif o.effect is Effect.PENDING:
            key = ("parsed, refused at start-up (not supported yet)", o.note)
        else:
            key = ("refused as by llama-server b1-0c1e570", o.note or "the argument has been removed")
        groups.setdefault(key, []).append(next((a for a in o.args if a.startswith("--")), o.args[0]))
    order = ["takes effect", "prints and exits", "accepted, no effect",
             "parsed, refused at start-up (not supported yet)", "refused as by llama-server b1-0c1e570"]
    rows = ["| flags | in tritium |", "| --- | --- |"]
    for what in order:
        for (w, why), flags in groups.items():
            if w == what:
                rows.append(f"| {', '.join(f'`{f}`' for f in flags)} | {what}{': ' + why if why else ''} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    from api.cli_args import OPTIONS

    write(markdown_table(OPTIONS))

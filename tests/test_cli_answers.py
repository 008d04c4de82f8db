"""tritium-server's parser answers every command line llama-server b1-0c1e570 refuses while parsing
as the binary answered it: exit status, stdout and stderr, byte for byte (the usage block after an
error included). tests/data/llama_server_cli_answers.json was recorded from the reference binary
by scripts/record_cli_answers.py; `--version` names tritium instead, in llama-server's shape.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from api.cli_args import ArgError, Exit, build_parser

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = json.loads((ROOT / "tests" / "data" / "llama_server_cli_answers.json").read_text())["answers"]
VERSION = re.compile(r"version: \S+ \(build \d+, commit \S+\)\nbuilt with .+ for .+\n")
# a common_log line (LOG_WRN, COM_ERR): llama-server writes them from a thread, so they come before or
# after the error text, and one written just before exit may be lost; tritium writes each at once
LOG = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} ([EWI]) ", re.M)


def split_log(err: str) -> tuple[str, list[str]]:
    """(stderr without its log lines, the log lines without their time stamps)."""
    plain, logs = [], []
    for line in err.splitlines(keepends=True):
        m = LOG.match(line)
        if m:
            logs.append(line[m.start(1):])
        else:
            plain.append(line)
    return "".join(plain), logs


def tritium_answer(argv: list[str], env: dict[str, str], capsys) -> tuple[int, str, str]:
    """What api.cli.main prints for argv when parsing ends it (rc, stdout, stderr)."""
    capsys.readouterr()
    try:
        build_parser().parse_args(argv, environ=env)
        rc, out, err = 0, "", ""
    except Exit as e:
        rc, out, err = e.code, e.stdout, e.stderr
    except ArgError as e:
        rc, out, err = 1, "", str(e) + "\n"
    cap = capsys.readouterr()
    return rc, cap.out + out, cap.err + err


@pytest.mark.parametrize("a", ANSWERS, ids=lambda a: " ".join(a["argv"] + [f"{k}={v}" for k, v in a["env"].items()]))
def test_refusals_as_llama_server(a, capsys):
    rc, out, err = tritium_answer(a["argv"], a["env"], capsys)
    if a["argv"][:1] == ["--version"]:
        assert (rc, out) == (a["rc"], a["stdout"]) and VERSION.fullmatch(a["stderr"]) and VERSION.fullmatch(err)
        return
    want, want_logs = split_log(a["stderr"])
    got, got_logs = split_log(err)
    assert (rc, out, got) == (a["rc"], a["stdout"], want)
    assert set(want_logs) <= set(got_logs) and len(got_logs) == len(set(got_logs)) <= len(want_logs) + 1

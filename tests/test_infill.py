"""/infill: llama-server's fill-in-the-middle layout, and its refusal on a vocabulary without FIM
tokens (the lesson's Qwen2 vocab file has none)."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from api.infill import format_infill, parse_extra, prefix_and_suffix
from api.errors import ApiError
from runtime.tokenizer import load_tokenizer

VOCAB = Path(__file__).resolve().parents[2] / "shared" / "vocab"


@pytest.fixture(scope="module")
def coder():
    path = VOCAB / "ggml-vocab-deepseek-coder.gguf"
    if not path.exists():
        pytest.skip("../shared/vocab not available")
    return load_tokenizer(path)


def test_fim_ids_detected(coder):
    assert coder.fim_ids["pre"] == coder.token_id("<｜fim▁begin｜>")
    assert coder.fim_ids["suf"] == coder.token_id("<｜fim▁hole｜>")
    assert coder.fim_ids["mid"] == coder.token_id("<｜fim▁end｜>")


def test_layout_prefix_suffix_prompt_and_extra(coder):
    fim = coder.fim_ids
    enc = lambda t: coder.encode(t)  # noqa: E731
    prompt = enc(" x")
    toks = format_infill(coder, "def f():\n    return", "\nprint(f())", [("a.py", "A = 1")], prompt,
                         n_batch=2048, n_predict=-1, n_ctx=4096)
    extra = enc("\n\n--- snippet ---\n\n") + enc("A = 1")  # no file separator token in this vocab
    body = [fim["pre"], *enc("def f():\n    return"), *prompt, fim["suf"], *enc("\nprint(f())"), fim["mid"]]
    bos = [coder.bos_id] if coder.add_bos else []
    assert toks == extra + bos + body
    # a small batch keeps the end of the prefix and the start of the suffix
    short = format_infill(coder, "a b c d e f g h", "1 2 3 4 5 6 7 8", [], [], n_batch=8, n_predict=-1, n_ctx=4096)
    assert short[len(bos):][:1] == [fim["pre"]] and short[-1] == fim["mid"]
    assert len(short) == len(bos) + 1 + 6 + 1 + 0 + 1  # 3/4 of 8 prefix tokens, no room for suffix


def test_input_extra_validation():
    """b1-0c1e570's checks and messages (the reference asked the same, 2026-12-05)."""
    assert parse_extra({"input_extra": [{"filename": "a", "text": "b"}, {"text": "c"}]}) == [("a", "b"), ("tmp", "c")]
    assert parse_extra({}) == []
    whole = '"input_extra" must be an array of {"filename": string, "text": string}'
    text = 'extra_context chunk must contain a "text" field with a string value'
    name = 'extra_context chunk\'s "filename" field must be a string'
    for bad, message in (("x", whole), (None, whole), ([{"filename": "a"}], text), ([1], text),
                         ([{"text": "a", "filename": 2}], name)):
        with pytest.raises(ApiError) as e:
            parse_extra({"input_extra": bad})
        assert (e.value.code, e.value.message) == (400, message)


def test_prefix_and_suffix_are_read_as_b1_reads_them():
    assert prefix_and_suffix({"input_prefix": "a", "input_suffix": ""}) == ("a", "")
    for body, message in (({"input_prefix": "a"}, "[json.exception.out_of_range.403] key 'input_suffix' not found"),
                          ({"input_suffix": "a"}, "[json.exception.out_of_range.403] key 'input_prefix' not found"),
                          ({"input_prefix": 5}, "[json.exception.out_of_range.403] key 'input_suffix' not found"),
                          ({"input_prefix": 5, "input_suffix": ""},
                           "[json.exception.type_error.302] type must be string, but is number")):
        with pytest.raises(ApiError) as e:
            prefix_and_suffix(body)
        assert (e.value.code, e.value.type, e.value.message) == (500, "server_error", message)


def test_infill_refused_without_fim_tokens(start_server, lesson_model):
    s = start_server("-m", str(lesson_model), "-np", "1", "-c", "1024")
    r = httpx.post(s.url + "/infill", json={"input_prefix": "def f():", "input_suffix": "", "n_predict": 4})
    assert r.status_code == 501
    assert r.json()["error"] == {
        "code": 501, "type": "not_supported_error",
        "message": "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
                   "middle token is missing. "}
    s.stop()


def test_infill_generates_on_a_fim_vocab(start_server, coder, tmp_path):
    from runtime.model.tiny_model import spec_with, write_tiny_model

    path = write_tiny_model(tmp_path / "coder.gguf", spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128),
                            vocab=VOCAB / "ggml-vocab-deepseek-coder.gguf")
    s = start_server("-m", str(path), "-np", "1", "-c", "2048")
    body = {"input_prefix": "def f():\n    return", "input_suffix": "\nprint(f())", "prompt": " x",
            "input_extra": [{"filename": "a.py", "text": "A = 1"}], "n_predict": 3, "temperature": 0}
    r = httpx.post(s.url + "/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    d = r.json()
    expect = format_infill(coder, body["input_prefix"], body["input_suffix"], [("a.py", "A = 1")],
                           coder.encode(" x", parse_special=True), n_batch=2048, n_predict=-1, n_ctx=2048)
    assert d["tokens_evaluated"] == len(expect) and d["tokens_predicted"] == 3 and d["stop_type"] == "limit"
    with httpx.stream("POST", s.url + "/infill", json={**body, "stream": True}, timeout=60) as st:
        chunks = [line for line in st.iter_lines() if line.startswith("data: ")]
    assert '"stop":true' in chunks[-1].replace(" ", "")
    s.stop()

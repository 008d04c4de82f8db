"""`--rerank`: `/rerank` and its aliases on the tiny generated reranker (runtime.model.tiny_model
RERANK_SPEC: qwen3, a Qwen3-Reranker's `cls.output` yes/no head, RANK pooling, rerank template),
in process (the real app on a real engine). Scores are compared with llama-server b1-0c1e570's on
the same file (tests/data/rerank_reference.json, scripts/record_rerank_reference.py), recorded with
one slot: llama-server's own scores move by up to ~3e-4 with what its other slots run in the same
batch (a document scored beside three others vs alone), tritium's do not."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from api.cli import server_config
from api.cli_args import build_parser
from runtime.model.tiny_model import RERANK_SPEC, write_tiny_model

REFERENCE = Path(__file__).parent / "data" / "rerank_reference.json"
DOCS = ["A machine is a physical system that uses power to apply forces.",
        "Learning is the process of acquiring new understanding.",
        "Machine learning is a field of study in artificial intelligence.",
        "Paris, capitale de la France, est une grande ville européenne."]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    from runtime.serving import Engine, EngineConfig

    path = write_tiny_model(tmp_path_factory.mktemp("rerank") / "tiny-reranker.gguf", RERANK_SPEC, vocab="builtin")
    e = Engine(EngineConfig(model_path=str(path), n_ctx=1024, n_parallel=2, verbosity=0, warmup=False,
                            embeddings=True))
    e.load()
    e.start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def client(reranker, api_client):
    with api_client(reranker, embeddings=True, pooling="rank") as c:
        yield c


def test_flag_turns_on_rank_pooling():
    for flag in ("--rerank", "--reranking"):
        cfg = server_config(build_parser().parse_args(["-m", "x.gguf", flag]))
        assert cfg.embeddings and cfg.pooling == "rank"


def _same_as_reference(client, cases: list[dict]) -> None:
    for case in cases:
        r = client.post(case["path"], json=case["request"])
        got, want = r.json(), case["response"]
        assert r.status_code == case["status"], (case, r.text)
        if case["status"] != 200:
            assert got == want
            continue
        if isinstance(want, dict):  # Jina: the same keys and token counts (the template included)
            assert set(got) == set(want) and got["usage"] == want["usage"] and got["object"] == "list"
            got, want = got["results"], want["results"]
        assert [x["index"] for x in got] == [x["index"] for x in want]  # the same order
        for g, w in zip(got, want):
            assert set(g) == set(w) and g.get("text") == w.get("text")
            label = "score" if "score" in w else "relevance_score"
            assert abs(g[label] - w[label]) < 1e-5, (g, w)


def test_scores_match_llama_server(client, reranker):
    ref = json.loads(REFERENCE.read_text())
    assert hashlib.sha256(Path(reranker.cfg.model_path).read_bytes()).hexdigest() == ref["model_sha256"]
    _same_as_reference(client, ref["cases"])


def test_model_without_a_head_scores_like_llama_server(api_engine, api_client):
    """--rerank on a llama model: no `cls.output`, llama.cpp's score is the last token's first value."""
    ref = json.loads(REFERENCE.read_text())
    assert hashlib.sha256(Path(api_engine.cfg.model_path).read_bytes()).hexdigest() == ref["headless_model_sha256"]
    with api_client(api_engine, embeddings=True, pooling="rank") as c:
        _same_as_reference(c, ref["headless_cases"])


def test_shapes_and_top_n(client):
    r = client.post("/v1/rerank", json={"query": "Machine learning is", "documents": DOCS, "model": "mine"})
    body = r.json()
    assert r.status_code == 200 and body["model"] == "mine" and body["object"] == "list"
    scores = [x["relevance_score"] for x in body["results"]]
    assert sorted(scores, reverse=True) == scores and sorted(x["index"] for x in body["results"]) == [0, 1, 2, 3]
    assert all(0.0 < s < 1.0 for s in scores)  # a softmax over the yes/no head
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    for top_n, n in ((None, 4), (2, 2), (0, 0), (99, 4), ("x", 4), (1.9, 1), (True, 1)):
        data = {"query": "q", "documents": DOCS} | ({} if top_n is None else {"top_n": top_n})
        assert len(client.post("/rerank", json=data).json()["results"]) == n, top_n
    tei = client.post("/reranking", json={"query": "q", "texts": DOCS[:2], "return_text": True}).json()
    assert isinstance(tei, list) and {x["index"]: x["text"] for x in tei} == {0: DOCS[0], 1: DOCS[1]}
    assert set(tei[0]) == {"index", "score", "text"}
    no_text = client.post("/v1/reranking", json={"query": "q", "texts": DOCS[:2], "return_text": "yes"}).json()
    assert set(no_text[0]) == {"index", "score"}  # return_text must be a boolean true
    # the same document scores the same wherever it is and whatever runs beside it
    one = client.post("/rerank", json={"query": "q", "documents": [DOCS[1]]}).json()["results"][0]["relevance_score"]
    many = client.post("/rerank", json={"query": "q", "documents": DOCS}).json()["results"]
    assert abs(next(x["relevance_score"] for x in many if x["index"] == 1) - one) < 1e-6


@pytest.mark.parametrize("body,message", [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 1, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": None}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": 123}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2, 3]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [{"text": "a"}]}, '"documents" must be a non-empty string array'),
])
def test_invalid_requests(client, body, message):
    r = client.post("/rerank", json=body)
    assert r.status_code == 400 and r.json()["error"] == {"code": 400, "message": message,
                                                          "type": "invalid_request_error"}


def test_context_and_disabled(client, api_engine, api_client):
    r = client.post("/rerank", json={"query": "q " * 2000, "documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    with api_client(api_engine, embeddings=True) as plain:  # embeddings, but not --rerank
        r = plain.post("/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 501 and r.json()["error"]["message"] == \
            "This server does not support reranking. Start it with `--reranking`"

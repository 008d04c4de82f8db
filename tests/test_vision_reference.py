"""Images through tritium against llama.cpp b1-0c1e570 on the same files: the tiny vision pairs of
runtime.vision.tiny_mmproj (Gemma 3 SigLIP, Qwen2.5-VL, Qwen3-VL), regenerated here bit for bit,
and the images of tests/data/vision/. Recorded with the reference build by
scripts/record_vision_reference.py:

- the image embeddings of libmtmd (mtmd_encode_chunk), and the text tokens around each image
  chunk, its size in tokens and positions and its grid;
- llama-server's greedy answers (one slot, requests in order: the prompt cache with images is
  part of it), compared token for token up to the first near-tie of the reference (a top-2
  logprob margin under `margin`, where float noise may pick either), with the prompt counts.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data" / "vision"
REF = json.loads((DATA / "reference.json").read_text())
KINDS = list(REF["kinds"])


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    from runtime.vision.tiny_mmproj import write_pair

    d = tmp_path_factory.mktemp("vision-pairs")
    out = {}
    for kind in KINDS:
        model, mmproj = write_pair(d, kind)
        rec = REF["kinds"][kind]
        assert hashlib.sha256(model.read_bytes()).hexdigest() == rec["model_sha256"], f"{kind}: the model changed"
        assert hashlib.sha256(mmproj.read_bytes()).hexdigest() == rec["mmproj_sha256"], f"{kind}: the mmproj changed"
        out[kind] = (model, mmproj)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_embeddings_equal_libmtmd(pairs, kind):
    from runtime.tokenizer import load_tokenizer
    from runtime.vision.audio import AudioEncoder
    from runtime.vision.encoder import VisionEncoder
    from runtime.vision.media import tokenize_media
    from runtime.vision.mmproj import read_mmproj

    model, mmproj = pairs[kind]
    mm = read_mmproj(mmproj)
    enc = VisionEncoder(mm)
    audio = AudioEncoder(mm) if mm.audio is not None else None
    tok = load_tokenizer(str(model))
    ref = np.load(DATA / "embeddings.npz")
    for name, rec in REF["kinds"][kind]["images"].items():
        mp = tokenize_media(tok, REF["marker"], [(DATA / name).read_bytes()], REF["marker"], mm.vision, audio,
                            mrope=kind != "gemma3")
        c = mp.chunks[0]
        assert mp.tokens[:c.start] == rec["before"] and mp.tokens[c.end:] == rec["after"], name
        assert (c.n_tokens, c.n_pos) == (rec["n_tokens"], rec["n_pos"]), name
        if kind != "gemma3" and c.kind == "image":  # M-RoPE grids (1-D chunks: mtmd says nx = n_tokens, ny = 1)
            assert (c.nx, c.ny) == (rec["nx"], rec["ny"]), name
        want = ref[f"{kind}/{name}"].astype(np.float32)
        got = (audio if c.kind == "audio" else enc).encode(c.data).numpy()
        assert got.shape == want.shape, name
        # float16 rounding where ggml rounds (weights, im2col, flash attention) and in the record
        np.testing.assert_allclose(got, want, atol=2e-3 + 2e-3 * float(np.abs(want).max()), rtol=0, err_msg=name)


def _compare(name: str, rec: dict, res: dict, margin: float) -> int:
    """The generated tokens up to the reference's first near-tie, and the prompt counts; returns
    how many tokens were compared."""
    n = next((i for i, m in enumerate(rec["margins"]) if m < margin), len(rec["margins"]))
    if "tokens" in rec:
        assert res["tokens"][:n] == rec["tokens"][:n], name
        assert (res["tokens_evaluated"], res["tokens_cached"]) == (rec["tokens_evaluated"], rec["tokens_cached"]), name
    else:
        texts = [s["token"] for s in res["choices"][0]["logprobs"]["content"]]
        assert texts[:n] == rec["token_texts"][:n], name
        assert res["usage"]["prompt_tokens"] == rec["usage"]["prompt_tokens"], name
        assert res["usage"]["prompt_tokens_details"] == rec["usage"]["prompt_tokens_details"], name
    return n


@pytest.mark.parametrize("kind", KINDS)
def test_answers_equal_llama_server(pairs, kind, api_client):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from record_vision_reference import requests_for
    from runtime.serving import Engine, EngineConfig

    model, mmproj = pairs[kind]
    e = Engine(EngineConfig(model_path=str(model), mmproj=str(mmproj), n_ctx=2048, n_parallel=1, verbosity=0,
                            warmup=False))  # record_vision_reference.server_flags
    e.load()
    e.start()
    try:
        c = api_client(e, media_marker=REF["marker"])
        props = c.get("/props").json()
        assert props["modalities"] == {"vision": True, "video": True, "audio": kind == "qwen25o"}
        assert props["media_marker"] == REF["marker"]
        assert c.get("/v1/models").json()["models"][0]["capabilities"] == ["completion", "multimodal"]
        compared = total = 0
        for r in requests_for(kind):  # in order: the later ones reuse the cached prompt
            res = c.post(r["path"], json=r["body"])
            assert res.status_code == 200, (r["name"], res.text)
            rec = REF["kinds"][kind]["answers"][r["name"]]
            compared += _compare(f"{kind}/{r['name']}", rec, res.json(), REF["margin"])
            total += len(rec["margins"])
        assert compared >= 0.8 * total  # the records are mostly clear-cut
    finally:
        e.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_embeddings_equal_llama_server(pairs, kind, api_client):
    """--embeddings --pooling mean with media in the prompts: llama-server's pooled vectors (of the
    text after the last media chunk, the batch it decodes last), usage and its too-large error."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from record_vision_reference import embedding_requests, embedding_ubatch
    from runtime.serving import Engine, EngineConfig

    model, mmproj = pairs[kind]
    n = embedding_ubatch(kind)
    e = Engine(EngineConfig(model_path=str(model), mmproj=str(mmproj), n_ctx=2048, n_parallel=1, verbosity=0,
                            warmup=False, embeddings=True, n_batch=n, n_ubatch=n))  # record_vision_reference
    e.load()
    e.start()
    try:
        c = api_client(e, media_marker=REF["marker"], embeddings=True, pooling="mean")
        for r in embedding_requests(kind):
            rec = REF["kinds"][kind]["embeddings"][r["name"]]
            res = c.post(r["path"], json=r["body"])
            if "error" in rec:
                assert (res.status_code, res.json()) == (rec["error"]["code"], {"error": rec["error"]}), r["name"]
                continue
            assert res.status_code == 200, (r["name"], res.text)
            body = res.json()
            if "usage" in rec:
                assert body["usage"] == rec["usage"], r["name"]
                got = [d["embedding"] for d in body["data"]]
            else:
                got = [d["embedding"][0] for d in body]
            want = np.array(rec["vectors"])
            assert len(got) == len(want), r["name"]
            # unit vectors; the media embeddings' float16 rounding (as in test_embeddings_equal_libmtmd)
            np.testing.assert_allclose(np.array(got), want, atol=2e-3, rtol=0, err_msg=f"{kind}/{r['name']}")
            assert np.abs(want[0] - want[-1]).max() > 1e-2  # the media changed the vector
    finally:
        e.stop()

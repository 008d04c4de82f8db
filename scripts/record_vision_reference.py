#!/usr/bin/env python3
"""Records llama.cpp b1-0c1e570's image embeddings and llama-server's greedy answers with images on
the tiny pairs of runtime.vision.tiny_mmproj (gemma3, qwen25vl, qwen3vl; qwen25o with audio) into
tests/data/vision/ (tests/test_vision_reference.py compares tritium's with them).

The pairs are generated here, deterministically, so that the tests regenerate the very same files
(their sha256 are recorded and checked) without the reference binary; the images are the files
in tests/data/vision/. The embeddings come from scripts/mtmd_embd_ref.c against the reference
build's libmtmd (each image tokenized with the default marker and its chunk encoded, llama-server's
mtmd parameters), kept as float16 in embeddings.npz; the answers from llama-server itself
(`server_flags`, LLAMA_MEDIA_MARKER fixed): chat requests with one or two images, /completion with
`multimodal_data`, and a repeated and a follow-up chat (the prompt cache with images), and with
--embeddings the pooled vectors of prompts with media (`embedding_requests`). Each answer
records the top-2 logprob margin of every generated token: a test compares the tokens up to the
first near-tie (margin < MARGIN), where float noise may pick either.

    python scripts/record_vision_reference.py --server /work/lsb/llama-server
    # LLAMA_CPP=<llama.cpp source tree with build/bin/libmtmd.so> (default: scripts/build_llama_server.sh's)
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.vision.tiny_mmproj import KINDS, write_pair  # noqa: E402

DATA = ROOT / "tests" / "data" / "vision"
IMAGES = ["small.png", "small.jpg", "wide.jpg", "tall.png", "gray.png"]
AUDIO = ["tone.wav"]  # the audio kind's (qwen25o) clips


def media_of(kind: str) -> list[str]:
    """The files whose embeddings are recorded for `kind`."""
    return AUDIO + IMAGES[:2] if kind == "qwen25o" else IMAGES
MARKER = "<__media__>"
MARGIN = 0.01
N_PREDICT = 8


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def data_url(name: str) -> str:
    kind = "jpeg" if name.endswith(".jpg") else "png"
    return f"data:image/{kind};base64," + base64.b64encode((DATA / name).read_bytes()).decode()


def requests_for(kind: str = "") -> list[dict]:
    """The recorded requests of `kind`: path and body of each case, by name."""
    if kind == "qwen25o":
        return audio_requests()
    out = []
    for name in IMAGES:
        out.append({"name": f"chat-{name}", "path": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                                      {"type": "image_url", "image_url": {"url": data_url(name)}}]}],
            "max_tokens": N_PREDICT, "temperature": 0, "logprobs": True, "top_logprobs": 2}})
        out.append({"name": f"completion-{name}", "path": "/completion", "body": {
            "prompt": {"prompt_string": f"Describe {MARKER} in a word:",
                       "multimodal_data": [base64.b64encode((DATA / name).read_bytes()).decode()]},
            "n_predict": N_PREDICT, "temperature": 0, "n_probs": 2, "return_tokens": True}})
    two = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url("tall.png")}}, {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": data_url("small.jpg")}}, {"type": "text", "text": "compare"}]}],
        "max_tokens": N_PREDICT, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    out.append({"name": "chat-two-images", "path": "/v1/chat/completions", "body": two})
    out.append({"name": "chat-two-images-again", "path": "/v1/chat/completions", "body": two})
    follow = json.loads(json.dumps(two))
    follow["messages"] += [{"role": "assistant", "content": "They differ."},
                           {"role": "user", "content": "How?"}]
    out.append({"name": "chat-follow-up", "path": "/v1/chat/completions", "body": follow})
    return out


def audio_requests() -> list[dict]:
    """Audio clips (input_audio parts, multimodal_data), alone and beside an image, and again."""
    wav = base64.b64encode((DATA / AUDIO[0]).read_bytes()).decode()
    chat = {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}, {"type": "text", "text": "What is this?"}]}],
        "max_tokens": N_PREDICT, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    both = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Listen"}, {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
        {"type": "text", "text": "and look"}, {"type": "image_url", "image_url": {"url": data_url("small.png")}}]}],
        "max_tokens": N_PREDICT, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    return [{"name": "chat-audio", "path": "/v1/chat/completions", "body": chat},
            {"name": "completion-audio", "path": "/completion", "body": {
                "prompt": {"prompt_string": f"Hear {MARKER} now:", "multimodal_data": [wav]},
                "n_predict": N_PREDICT, "temperature": 0, "n_probs": 2, "return_tokens": True}},
            {"name": "chat-audio-and-image", "path": "/v1/chat/completions", "body": both},
            {"name": "chat-audio-again", "path": "/v1/chat/completions", "body": chat}]


def embedding_requests(kind: str) -> list[dict]:
    """--embeddings --pooling mean: /embeddings with prompt objects and /v1/embeddings with content
    parts (llama-server pools the text after the last media chunk: the batch it decodes last)."""
    def b64(name: str) -> str:
        return base64.b64encode((DATA / name).read_bytes()).decode()
    name = AUDIO[0] if kind == "qwen25o" else "small.png"
    part = ({"type": "input_audio", "input_audio": {"data": b64(name), "format": "wav"}} if kind == "qwen25o"
            else {"type": "image_url", "image_url": {"url": data_url(name)}})
    return [{"name": "embeddings-prompts", "path": "/embeddings", "body": {"content": [
                {"prompt_string": f"What is this: {MARKER}\n", "multimodal_data": [b64(name)]},
                {"prompt_string": f"What is this: {MARKER}\n", "multimodal_data": [b64("wide.jpg")]},
                {"prompt_string": "What is this: \n"}]}},
            {"name": "embeddings-oai", "path": "/v1/embeddings", "body": {"input": [
                {"content": [{"type": "text", "text": "Look at "}, part, {"type": "text", "text": " and say more"}]},
                {"prompt_string": f"{MARKER} then {MARKER} end", "multimodal_data": [b64("tall.png"), b64("gray.png")]},
                "What is this: \n"]}},
            {"name": "embeddings-too-large", "path": "/v1/embeddings",  # longer than a ubatch: a 500
             "body": {"input": "hello " * (embedding_ubatch(kind) + 10)}}]


def embedding_record(res) -> dict:
    """The pooled vectors (6 decimals) and, from /v1/embeddings, the usage (or the error)."""
    if isinstance(res, dict) and "error" in res:
        return {"error": res["error"]}
    if isinstance(res, list):
        return {"vectors": [[round(x, 6) for x in r["embedding"][0]] for r in res]}
    return {"vectors": [[round(x, 6) for x in d["embedding"]] for d in res["data"]], "usage": res["usage"]}


def answer_record(path: str, res: dict) -> dict:
    """What a test compares: the generated tokens (or token texts), their margins, the counts."""
    if path == "/completion":
        steps = res["completion_probabilities"]
        margins = [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"] for s in steps]
        return {"tokens": res["tokens"], "margins": margins, "content": res["content"],
                "tokens_evaluated": res["tokens_evaluated"], "tokens_cached": res["tokens_cached"]}
    steps = res["choices"][0]["logprobs"]["content"]
    margins = [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"] for s in steps]
    return {"token_texts": [s["token"] for s in steps], "margins": margins,
            "content": res["choices"][0]["message"]["content"], "usage": res["usage"]}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port: int, path: str, body: dict, errors: bool = False) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(req, timeout=300).read())
    except urllib.error.HTTPError as e:
        if not errors:
            raise
        return json.loads(e.read())


def server_flags(kind: str) -> list[str]:
    """The flags of both servers."""
    return ["-np", "1", "-c", "2048", "--no-warmup"]


def embedding_ubatch(kind: str) -> int:
    """-b / -ub of the --embeddings server: a prompt of an embedding task (pooling mean) must fit one
    ubatch, and a 30 s audio chunk is 750 tokens."""
    return 1024 if kind == "qwen25o" else 512


def embedding_flags(kind: str) -> list[str]:
    n = str(embedding_ubatch(kind))
    return ["--embeddings", "--pooling", "mean", "-b", n, "-ub", n]


def record_answers(server: str, kind: str, model: Path, mmproj: Path, embeddings: bool = False) -> dict:
    port = free_port()
    env = dict(os.environ, LLAMA_MEDIA_MARKER=MARKER)
    flags = server_flags(kind) + (embedding_flags(kind) if embeddings else [])
    p = subprocess.Popen([server, "-m", str(model), "--mmproj", str(mmproj), "--port", str(port), *flags],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health").status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        if embeddings:
            return {r["name"]: embedding_record(post(port, r["path"], r["body"], errors=True)) for r in embedding_requests(kind)}
        return {r["name"]: answer_record(r["path"], post(port, r["path"], r["body"])) for r in requests_for(kind)}
    finally:
        p.terminate()
        p.wait()


def read_embeddings(path: Path, n: int) -> list[dict]:
    """The records mtmd_embd_ref writes (see its header)."""
    b = path.read_bytes()
    off = 0

    def i32() -> int:
        nonlocal off
        v = struct.unpack_from("<i", b, off)[0]
        off += 4
        return v
    out = []
    for _ in range(n):
        before = [i32() for _ in range(i32())]
        nx, ny, nt, npos, ne = i32(), i32(), i32(), i32(), i32()
        e = np.frombuffer(b, np.float32, nt * ne, off).reshape(nt, ne)
        off += nt * ne * 4
        after = [i32() for _ in range(i32())]
        out.append({"before": before, "after": after, "nx": nx, "ny": ny, "n_tokens": nt, "n_pos": npos, "embd": e})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="/work/lsb/llama-server")
    a = ap.parse_args()
    root = Path(os.environ.get("LLAMA_CPP", "/work/lsb/src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
    out: dict = {"recorded_with": "python scripts/record_vision_reference.py (llama-server and libmtmd of "
                                  "llama.cpp b1-0c1e570)", "marker": MARKER, "margin": MARGIN, "images": IMAGES,
                 "kinds": {}}
    arrays = {}
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "mtmd_embd_ref"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(ROOT / "scripts" / "mtmd_embd_ref.c"), f"-I{root}/include",
                        f"-I{root}/ggml/include", f"-I{root}/tools/mtmd", f"-L{root}/build/bin", "-lmtmd", "-lllama",
                        "-lggml", "-lggml-base", f"-Wl,-rpath,{root}/build/bin", "-Wno-deprecated-declarations"],
                       check=True)
        for kind in KINDS:
            model, mmproj = write_pair(d, kind)
            emb_file = Path(d) / f"{kind}.bin"
            subprocess.run([str(exe), str(model), str(mmproj), "-1", "-1", str(emb_file),
                            *[str(DATA / n) for n in media_of(kind)]], check=True)
            images = {}
            for name, r in zip(media_of(kind), read_embeddings(emb_file, len(media_of(kind)))):
                arrays[f"{kind}/{name}"] = r.pop("embd").astype(np.float16)
                images[name] = r
            answers = record_answers(a.server, kind, model, mmproj)
            out["kinds"][kind] = {"model_sha256": sha256(model), "mmproj_sha256": sha256(mmproj),
                                  "images": images, "answers": answers,
                                  "embeddings": record_answers(a.server, kind, model, mmproj, embeddings=True)}
            print(kind, {k: sum(1 for m in v["margins"] if m >= MARGIN) for k, v in answers.items()}, file=sys.stderr)
    (DATA / "reference.json").write_text(json.dumps(out, indent=1) + "\n")
    np.savez_compressed(DATA / "embeddings.npz", **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())

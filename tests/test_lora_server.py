"""LoRA adapters in a running server: --lora / --lora-scaled / --lora-init-without-apply,
GET/POST /lora-adapters, the per-request `lora` field, requests with different adapter sets
decoded side by side, and the same greedy tokens as llama-server b1-0c1e570 on the same files
(tests/data/lora_greedy.json, recorded from /work/lsb/llama-server by
scripts/record_lora_reference.py; `--via libllama`, the same build's library driven by
scripts/lora_greedy_ref.c, records the very same tokens)."""
from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from api.cli import ArgError, build_parser, lora_adapters

DATA = Path(__file__).parent / "data" / "lora_greedy.json"
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "record_lora_reference.py"


def _script():
    spec = importlib.util.spec_from_file_location("record_lora_reference", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_lora_flags():
    a = build_parser().parse_args(["--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5,d.gguf:-1", "--lora", "e.gguf"])
    assert lora_adapters(a) == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.5), ("d.gguf", -1.0), ("e.gguf", 1.0)]
    with pytest.raises(ArgError, match='"--lora-scaled": lora-scaled format: FNAME:SCALE'):
        lora_adapters(build_parser().parse_args(["--lora-scaled", "c.gguf"]))
    assert build_parser().parse_args(["--lora-init-without-apply"]).lora_init_without_apply


@pytest.fixture(scope="module")
def files(shared_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-server")
    return _script().tiny_lora_files(shared_dir / "vocab" / "ggml-vocab-qwen2.gguf", d)


@pytest.fixture(scope="module")
def server(start_server, files):
    model, a0, a1 = files
    return start_server(*_script().server_args(model, a0, a1), "-np", "2", "--lora-init-without-apply")


def completion(srv, prompt, lora=None, n=12):
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "return_tokens": True}
    if lora is not None:
        body["lora"] = lora
    r = httpx.post(srv.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_lora_adapters_endpoints(server, files):
    model, a0, a1 = files
    got = httpx.get(server.url + "/lora-adapters").json()
    # --lora-init-without-apply: loaded with scale 0
    assert got == [{"id": 0, "path": str(a0), "scale": 0.0, "task_name": "", "prompt_prefix": ""},
                   {"id": 1, "path": str(a1), "scale": 0.0, "task_name": "", "prompt_prefix": ""}]
    base = completion(server, "Hello")["tokens"]
    r = httpx.post(server.url + "/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 200 and r.json() == {"success": True}
    assert [x["scale"] for x in httpx.get(server.url + "/lora-adapters").json()] == [1.0, 0.0]  # unlisted: 0
    with_a0 = completion(server, "Hello")
    assert with_a0["tokens"] != base
    # a request's own adapters win over the server's; unlisted ones are 0
    own = completion(server, "Hello", lora=[{"id": 1, "scale": 0.0}])
    assert own["tokens"] == base and own["generation_settings"]["lora"] == [{"id": 1, "scale": 0.0}]
    assert completion(server, "Hello", lora=[])["tokens"] == with_a0["tokens"]  # empty: the server's
    # errors
    r = httpx.post(server.url + "/lora-adapters", json={"id": 0, "scale": 1})
    assert r.status_code == 400 and r.json()["error"] == {"code": 400, "message": "Request body must be an array",
                                                          "type": "invalid_request_error"}
    r = httpx.post(server.url + "/completion", json={"prompt": "x", "lora": {"id": 0}})
    assert r.status_code == 400 and "'lora' must be an array" in r.json()["error"]["message"]
    httpx.post(server.url + "/lora-adapters", json=[])  # back to all 0
    assert completion(server, "Hello")["tokens"] == base


def test_different_adapters_side_by_side(server):
    """Two slots decoding at once with different adapter sets: each gets what it gets alone."""
    cases = [("Once upon a time", [{"id": 0, "scale": 1.0}]), ("Once upon a time", None),
             ("Once upon a time", [{"id": 0, "scale": 0.5}, {"id": 1, "scale": 1.0}])]
    alone = [completion(server, p, lora, n=24)["tokens"] for p, lora in cases]
    assert len({tuple(t) for t in alone}) == 3
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        together = list(ex.map(lambda c: completion(server, c[0], c[1], n=24)["tokens"], cases))
    assert together == alone


def test_same_greedy_tokens_as_llama_server(start_server, files):
    ref = json.loads(DATA.read_text())
    model, a0, a1 = files
    for key, path in (("model", model), ("adapter0", a0), ("adapter1", a1)):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ref["sha256"][key], f"{key} differs from the recording"
    mod = _script()
    srv = start_server(*mod.server_args(model, a0, a1))
    assert [x["scale"] for x in httpx.get(srv.url + "/lora-adapters").json()] == ref["lora_adapters_scales"]
    assert mod.record_all(srv.url) == ref["tokens"]

"""Router mode end to end: `tritium-server --models-dir DIR` (no -m) on generated tiny models, each
served by its own worker process. Listing and states, autoload on a request's `model`, streams
relayed, `/models/load|unload`, `/models/sse` events, `--models-max` evicting the least recently
used model, a killed worker (the router goes on; the model loads again on the next request), a
model that fails to load, `--no-models-autoload`, API keys, INI presets with aliases and
`load-on-startup`, and a SIGTERM that takes the workers down with the router. The JSON shapes
and error texts are compared with llama-server b1-0c1e570's router on the same requests
(tests/data/router_reference.json, scripts/record_router_reference.py)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from runtime.model.tiny_model import BUILTIN_SPEC, write_tiny_model

REFERENCE = Path(__file__).parent / "data" / "router_reference.json"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    from dataclasses import replace

    d = tmp_path_factory.mktemp("router-models")
    for name, seed in (("tiny-a", 1), ("tiny-b", 2), ("tiny-c", 3)):
        write_tiny_model(d / f"{name}.gguf", replace(BUILTIN_SPEC, seed=seed), vocab="builtin")
    (d / "broken.gguf").write_bytes(b"GGUF not really")
    return d


def _models(url: str, headers: dict | None = None) -> dict[str, dict]:
    r = httpx.get(url + "/models", headers=headers)
    assert r.status_code == 200
    return {m["id"]: m for m in r.json()["data"]}


def _wait_status(url: str, name: str, want: set[str], timeout: float = 600.0, headers: dict | None = None) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = _models(url, headers)[name]
        if m["status"]["value"] in want:
            return m
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {want}: {m['status']}")


def _worker_pid(model_path: Path) -> int:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(model_path).encode() in cmd and b"api.cli" in cmd:
                return int(pid)
    raise AssertionError(f"no worker for {model_path}")


@pytest.fixture(scope="module")
def router(start_server, models_dir):
    s = start_server("--models-dir", str(models_dir), "--models-max", "2", "-c", "256", "-np", "1", "--no-warmup")
    yield s
    s.stop()


def test_listing_and_props(router, models_dir):
    ms = _models(router.url)
    assert sorted(ms) == ["broken", "tiny-a", "tiny-b", "tiny-c"]
    a = ms["tiny-a"]
    assert a["status"]["value"] == "unloaded" and a["source"] == "models_dir" and a["can_remove"] is False
    assert a["object"] == "model" and a["owned_by"] == "llamacpp" and a["aliases"] == [] and a["tags"] == []
    assert a["architecture"] == {"input_modalities": ["text"], "output_modalities": ["text"]}
    args = a["status"]["args"]
    assert args[args.index("--model") + 1] == str(models_dir / "tiny-a.gguf") and "--models-dir" not in args
    assert args[args.index("--ctx-size") + 1] == "256" and args[args.index("--alias") + 1] == "tiny-a"
    p = httpx.get(router.url + "/props").json()
    assert p["role"] == "router" and p["max_instances"] == 2 and p["models_autoload"] is True
    assert p["build_info"].startswith("b") and p["model_path"] == "none"
    assert httpx.get(router.url + "/health").json() == {"status": "ok"}


def test_routing_errors(router):
    r = httpx.post(router.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model name is missing from the request"
    r = httpx.post(router.url + "/v1/chat/completions", json=CHAT | {"model": "nope"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "model 'nope' not found"
    r = httpx.post(router.url + "/models/unload", json={"model": "tiny-c"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not running"
    r = httpx.get(router.url + "/slots")  # a GET proxied by ?model=
    assert r.status_code == 400 and r.json()["error"]["message"] == "model name is missing from the request"
    assert httpx.post(router.url + "/v1/chat/completions", content=b"{").status_code == 500
    assert httpx.get(router.url + "/nowhere").status_code == 404


def test_autoload_stream_and_proxy(router):
    r = httpx.post(router.url + "/v1/chat/completions", json=CHAT | {"model": "tiny-a"}, timeout=600)
    assert r.status_code == 200 and r.json()["model"] == "tiny-a" and r.json()["usage"]["completion_tokens"] == 4
    a = _models(router.url)["tiny-a"]
    assert a["status"]["value"] == "loaded" and a["meta"]["n_ctx"] == 256 and a["meta"]["n_vocab"] > 0
    with httpx.stream("POST", router.url + "/v1/completions", timeout=600,
                      json={"model": "tiny-b", "prompt": "hi", "max_tokens": 3, "stream": True}) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        assert s.headers["server"] == "llama.cpp"
        body = b"".join(s.iter_bytes()).decode()
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) >= 4
    assert json.loads(events[0][6:])["model"] == "tiny-b"
    r = httpx.get(router.url + "/props", params={"model": "tiny-a"})
    assert r.status_code == 200 and r.json()["model_alias"] == "tiny-a" and "role" not in r.json()
    r = httpx.post(router.url + "/tokenize", json={"model": "tiny-b", "content": "hello"})
    assert r.status_code == 200 and r.json()["tokens"]
    r = httpx.post(router.url + "/models/load", json={"model": "tiny-a"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is already running"


def test_shapes_match_llama_server_router(router):
    """What llama-server's router answers, tritium's answers: the keys of a model entry unloaded and
    loaded, /props, the routing errors' status and JSON (recorded on the same kind of models
    directory, tests/data/router_reference.json). Runs while tiny-a and tiny-b are loaded."""
    ref = json.loads(REFERENCE.read_text())
    ms = _models(router.url)
    for mine, want in ((ms["tiny-c"], ref["models"]["unloaded"]), (ms["tiny-a"], ref["models"]["loaded"])):
        assert set(mine) == set(want) and set(mine["status"]) == set(want["status"])
        assert set(mine.get("meta", {})) == set(want.get("meta", {}))
        assert {k: mine[k] for k in ("object", "owned_by", "architecture", "source", "can_remove")} == \
               {k: want[k] for k in ("object", "owned_by", "architecture", "source", "can_remove")}
    props = httpx.get(router.url + "/props").json()
    assert set(props) == set(ref["props"])
    assert {k: v for k, v in props.items() if k not in ("build_info",)} == \
           {k: v for k, v in ref["props"].items() if k not in ("build_info",)}
    for case in ref["errors"]:
        r = httpx.request(case["method"], router.url + case["path"], json=case["body"])
        assert (r.status_code, r.json()) == (case["status"], case["response"]), case


def test_models_max_evicts_lru_and_sse(router):
    httpx.post(router.url + "/tokenize", json={"model": "tiny-a", "content": "x"})  # tiny-b is now the LRU one
    got: list[dict] = []
    ready = threading.Event()

    def listen():
        with httpx.stream("GET", router.url + "/models/sse", timeout=60) as s:
            ready.set()
            for line in s.iter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[6:]))
                    if got[-1].get("model") == "tiny-c" and got[-1].get("data", {}).get("status") == "loaded":
                        return
    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(10)
    r = httpx.post(router.url + "/models/load", json={"model": "tiny-c"}, timeout=600)
    assert r.json() == {"success": True}
    _wait_status(router.url, "tiny-c", {"loaded"})
    t.join(30)
    ms = _models(router.url)
    assert ms["tiny-b"]["status"]["value"] == "unloaded" and "failed" not in ms["tiny-b"]["status"]
    assert ms["tiny-a"]["status"]["value"] == "loaded"
    seen = [(e["model"], e["event"], e.get("data", {}).get("status")) for e in got]
    assert ("tiny-b", "status_change", "unloaded") in seen and ("tiny-c", "model_status", "loading") in seen
    assert seen.index(("tiny-b", "status_change", "unloaded")) < seen.index(("tiny-c", "status_change", "loaded"))
    assert next(e for e in got if e["event"] == "status_change" and e["model"] == "tiny-b")["data"]["exit_code"] == 0
    assert next(e for e in got if e.get("data", {}).get("status") == "loaded")["data"]["info"]["id"] == "tiny-c"
    # a load's events as llama-server's router sends them (its recording: tiny-a's load)
    ref = json.loads(REFERENCE.read_text())["sse_events"]
    shape = lambda evs, m: [(e["event"], e["data"]["status"], sorted(e["data"]), sorted(e["data"].get("progress", {})))  # noqa: E731
                            for e in evs if e["model"] == m and e["data"]["status"] in ("loading", "loaded")]
    assert shape(got, "tiny-c") == shape(ref, "tiny-a")


def test_killed_worker_leaves_the_router_up(router, models_dir):
    os.kill(_worker_pid(models_dir / "tiny-c.gguf"), signal.SIGKILL)
    c = _wait_status(router.url, "tiny-c", {"unloaded"})
    assert c["status"]["failed"] is True and c["status"]["exit_code"] != 0
    assert httpx.get(router.url + "/health").status_code == 200
    assert _models(router.url)["tiny-a"]["status"]["value"] == "loaded"
    r = httpx.post(router.url + "/v1/completions", json={"model": "tiny-c", "prompt": "hi", "max_tokens": 2}, timeout=600)
    assert r.status_code == 200 and r.json()["model"] == "tiny-c"  # started again on demand
    assert "failed" not in _models(router.url)["tiny-c"]["status"]


def test_model_that_fails_to_load(router):
    ref = json.loads(REFERENCE.read_text())
    r = httpx.post(router.url + "/v1/completions", json={"model": "broken", "prompt": "hi"}, timeout=600)
    assert (r.status_code, r.json()) == (ref["failed_load"]["status"], ref["failed_load"]["response"])
    b = _models(router.url)["broken"]
    assert set(b["status"]) == set(ref["models"]["failed"]["status"])
    assert b["status"]["value"] == "unloaded" and b["status"]["failed"] is True and b["status"]["exit_code"] == 1
    ms = _models(router.url)  # the least recently used model made room for it
    assert ms["tiny-a"]["status"]["value"] == "unloaded" and ms["tiny-c"]["status"]["value"] == "loaded"
    r = httpx.post(router.url + "/models/unload", json={"model": "tiny-c"})
    assert r.json() == {"success": True}
    _wait_status(router.url, "tiny-c", {"unloaded"})


@pytest.fixture(scope="module")
def preset_router(start_server, models_dir, tmp_path_factory):
    ini = tmp_path_factory.mktemp("preset") / "models.ini"
    ini.write_text(f"[*]\nn-predict = 3\n\n[first]\nmodel = {models_dir / 'tiny-a.gguf'}\nalias = one,uno\n"
                   f"tags = small\nload-on-startup = true\n\n[second]\nm = {models_dir / 'tiny-b.gguf'}\n")
    s = start_server("--models-preset", str(ini), "--no-models-autoload", "--api-key", "sk-r", "-c", "128",
                     "--no-warmup")
    yield s
    s.stop()


def test_presets_no_autoload_and_api_key(preset_router, models_dir):
    url, key = preset_router.url, {"Authorization": "Bearer sk-r"}
    r = httpx.get(url + "/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/health").status_code == 200
    first = _wait_status(url, "first", {"loaded"}, headers=key)  # load-on-startup
    assert first["aliases"] == ["one", "uno"] and first["tags"] == ["small"] and first["source"] == "preset"
    assert "n-predict = 3" in first["status"]["preset"] and "api-key" not in " ".join(first["status"]["args"])
    r = httpx.post(url + "/v1/completions", json={"model": "uno", "prompt": "hi", "ignore_eos": True}, headers=key,
                   timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "first" and r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(url + "/v1/completions", json={"model": "second", "prompt": "hi"}, headers=key)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"
    r = httpx.post(url + "/v1/completions?autoload=true", json={"model": "second", "prompt": "hi"}, headers=key,
                   timeout=600)
    assert r.status_code == 200 and r.json()["model"] == "second"
    assert httpx.get(url + "/props", headers=key).json()["models_autoload"] is False


def test_sigterm_takes_the_workers_down(preset_router, models_dir):
    workers = [_worker_pid(models_dir / "tiny-a.gguf"), _worker_pid(models_dir / "tiny-b.gguf")]
    preset_router.proc.send_signal(signal.SIGTERM)
    assert preset_router.proc.wait(timeout=30) == 0
    for pid in workers:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_download_into_the_cache_and_delete(server_env, models_dir, tmp_path):
    """`POST /models` downloads a Hub model into the cache the router lists (a local stand-in for
    the Hub), with its SSE events; `DELETE /models?model=` removes its files."""
    from tests.conftest import ServerProcess
    from tests.local_hub import LocalHub

    gguf = (models_dir / "tiny-a.gguf").read_bytes()
    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(server_env, LLAMA_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("MODEL_ENDPOINT", None)
    with LocalHub({"local/tiny": {"tiny-F32.gguf": gguf, "README.md": b"# tiny\n"}}) as hub:
        env["HF_ENDPOINT"] = hub.url
        srv = ServerProcess(["--models-dir", str(empty), "--no-warmup"], tmp_path / "dl.log", env).wait_ready()
        try:
            got: list[dict] = []
            ready = threading.Event()

            def listen():
                with httpx.stream("GET", srv.url + "/models/sse", timeout=60) as s:
                    ready.set()
                    for line in s.iter_lines():
                        if line.startswith("data: "):
                            got.append(json.loads(line[6:]))
                            if got[-1]["event"] in ("download_finished", "download_failed"):
                                return
            t = threading.Thread(target=listen, daemon=True)
            t.start()
            assert ready.wait(10)
            assert httpx.post(srv.url + "/models", json={"model": ""}).json()["error"]["message"] == \
                "model must be a non-empty string"
            r = httpx.post(srv.url + "/models", json={"model": "local/tiny:F32"})
            assert r.json() == {"success": True}
            t.join(60)
            assert [e["event"] for e in got][-1] == "download_finished"
            m = _models(srv.url)["local/tiny:F32"]
            assert m["source"] == "cache" and m["can_remove"] is True and m["status"]["value"] == "unloaded"
            r = httpx.post(srv.url + "/models", json={"model": "local/tiny:F32"})
            assert r.status_code == 400 and r.json()["error"]["message"] == "model 'local/tiny:F32' already exists"
            r = httpx.post(srv.url + "/v1/completions", json={"model": "local/tiny:F32", "prompt": "hi",
                                                              "max_tokens": 2}, timeout=600)
            assert r.status_code == 200  # its worker reads the cached file
            assert httpx.delete(srv.url + "/models", params={"model": "local/tiny:F32"}).json() == {"success": True}
            assert "local/tiny:F32" not in _models(srv.url)
            assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.stat().st_size == len(gguf)]
            r = httpx.delete(srv.url + "/models", params={"model": "tiny-a"})
            assert r.status_code == 500 and "not found" in r.json()["error"]["message"]
        finally:
            srv.stop()

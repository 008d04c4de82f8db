"""`-hf user/repo[:quant]`, `-hff`, `--hf-token`, `--offline` (runtime/launch/hf_download.py): llama.cpp's
file-picking rules, and a real server downloading through `huggingface_hub` from a local Hub
(tests/local_hub.py: the Hub's URL layout over stdlib http.server), then starting offline."""
from __future__ import annotations

import os

import httpx
import pytest

from runtime.launch.hf_download import HfDownloadError, find_best_mmproj, pick_files, split_repo_tag
from tests.conftest import ServerProcess
from tests.local_hub import LocalHub

REPO_FILES = ["README.md", "mmproj-model-f16.gguf", "model-Q2_K.gguf", "model-Q8_0.gguf", "model-Q4_K_M.gguf",
              "model-IQ4_XS.gguf", "imatrix.gguf", "big/model-Q6_K-00001-of-00002.gguf",
              "big/model-Q6_K-00002-of-00002.gguf"]


@pytest.mark.parametrize("tag,expected", [
    ("", ["model-Q4_K_M.gguf"]),              # the default tag
    ("q8_0", ["model-Q8_0.gguf"]),             # case-insensitive
    ("IQ4_XS", ["model-IQ4_XS.gguf"]),
    ("Q6_K", ["big/model-Q6_K-00001-of-00002.gguf", "big/model-Q6_K-00002-of-00002.gguf"]),  # all parts
])
def test_pick_by_tag(tag, expected):
    assert pick_files(REPO_FILES, tag) == expected


def test_pick_defaults_and_fallbacks():
    no_q4 = [f for f in REPO_FILES if "Q4_K_M" not in f]
    assert pick_files(no_q4, "") == ["model-Q8_0.gguf"]  # then Q8_0
    only = ["mmproj-x-f16.gguf", "a/imatrix.gguf", "mtp-x.gguf", "z-F16.gguf", "b-BF16.gguf"]
    assert pick_files(only, "") == ["z-F16.gguf"]  # else the first model GGUF, in the listing's order
    with pytest.raises(HfDownloadError, match="no GGUF files found in repository for tag 'Q5_K_M'"):
        pick_files(REPO_FILES, "Q5_K_M")  # a tag given: no fallback
    with pytest.raises(HfDownloadError, match="no GGUF files found"):
        pick_files(["README.md", "mmproj-f16.gguf"], "")


def test_pick_hf_file():
    assert pick_files(REPO_FILES, "Q8_0", "model-Q2_K.gguf") == ["model-Q2_K.gguf"]  # -hff wins over the tag
    with pytest.raises(HfDownloadError, match="file 'nope.gguf' not found in repository; available GGUF files: "
                                              "mmproj-model-f16.gguf, model-Q2_K.gguf"):
        pick_files(REPO_FILES, "", "nope.gguf")


def test_find_best_mmproj():
    """llama.cpp's find_best_sibling(files, model, "mmproj"): the model's folder or one above it,
    the deepest first, then the quant bits closest to the model's, then the listing's order."""
    files = ["mmproj-F32.gguf", "mmproj-BF16.gguf", "mmproj-Q8_0.gguf", "a/mmproj-f16.gguf", "b/mmproj-Q4_0.gguf",
             "a/b/mmproj-f16.gguf", "mmproj.txt"]
    assert find_best_mmproj(files, "a/model-Q4_K_M.gguf") == "a/mmproj-f16.gguf"  # its folder wins
    assert find_best_mmproj(files, "model-Q4_K_M.gguf") == "mmproj-Q8_0.gguf"  # 8 bits: closest to 4
    assert find_best_mmproj(files, "model-F16.gguf") == "mmproj-BF16.gguf"  # 16 == 16 before F32's
    assert find_best_mmproj(files, "c/model-Q8_0-00001-of-00002.gguf") == "mmproj-Q8_0.gguf"
    assert find_best_mmproj(["model-Q8_0.gguf"], "model-Q8_0.gguf") is None


def test_split_repo_tag():
    assert split_repo_tag("user/repo") == ("user/repo", "")
    assert split_repo_tag("user/repo:Q4_K_M") == ("user/repo", "Q4_K_M")
    for bad in ("repo", "a/b/c", "a/b/c:Q8_0"):
        with pytest.raises(HfDownloadError, match=r"invalid HF repo format, expected <user>/<model>\[:quant\]"):
            split_repo_tag(bad)


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory) -> list[bytes]:
    """Two different tiny models (the Hub's cache shares equal blobs)."""
    from runtime.model.tiny_model import spec_with, write_tiny_model

    out = []
    for seed in (3, 4):
        path = tmp_path_factory.mktemp("hf") / "tiny.gguf"
        write_tiny_model(path, spec_with(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=512,
                                         name="hf-tiny", seed=seed), vocab="builtin")
        out.append(path.read_bytes())
    return out


def _server(args, tmp_path, env, name):
    return ServerProcess(["--no-warmup", "-c", "512", "-np", "1", *args], tmp_path / f"{name}.log", env)


def test_hf_download_with_its_mmproj(tmp_path, server_env):
    """A repository with a projector: -hf fetches it too and the server takes images (llama-server's
    --mmproj-auto, on by default); --no-mmproj leaves it."""
    from runtime.vision.tiny_mmproj import write_pair

    model, mmproj = write_pair(tmp_path, "gemma3")
    repo = {"vlm-Q8_0.gguf": model.read_bytes(), "mmproj-vlm-f16.gguf": mmproj.read_bytes(),
            "old/mmproj-vlm-f16.gguf": b"not this one"}
    env = dict(server_env, HF_HUB_CACHE=str(tmp_path / "hf-cache"), HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("MODEL_ENDPOINT", None)
    with LocalHub({"local/vlm": repo}) as hub:
        env["HF_ENDPOINT"] = hub.url
        srv = _server(["-hf", "local/vlm"], tmp_path, env, "vlm")
        try:
            srv.wait_ready(120)
            assert httpx.get(srv.url + "/props").json()["modalities"]["vision"] is True
        finally:
            srv.stop()
        assert hub.downloads("mmproj-vlm-f16.gguf") == 1 and hub.downloads("old/mmproj-vlm-f16.gguf") == 0
        srv = _server(["-hf", "local/vlm", "--no-mmproj", "--offline"], tmp_path, env, "vlm-no")
        try:
            srv.wait_ready(120)
            assert httpx.get(srv.url + "/props").json()["modalities"]["vision"] is False
        finally:
            srv.stop()


def test_hf_download_then_offline(tiny_ggufs, tmp_path, server_env):
    tiny_gguf, other_gguf = tiny_ggufs
    cache = tmp_path / "hf-cache"
    repo = {"README.md": b"# tiny\n", "mmproj-tiny-f16.gguf": b"not a model",
            "tiny-Q8_0.gguf": other_gguf, "tiny-Q4_K_M.gguf": tiny_gguf}
    env = dict(server_env, HF_HUB_CACHE=str(cache), HF_TOKEN="hf_secret", HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("MODEL_ENDPOINT", None)
    with LocalHub({"local/tiny": repo}) as hub:
        env["HF_ENDPOINT"] = hub.url
        srv = _server(["-hf", "local/tiny", "--no-mmproj"], tmp_path, env, "online")
        try:
            srv.wait_ready(120)
            props = httpx.get(srv.url + "/props").json()
            path = props["model_path"]
            assert path.startswith(str(cache)) and path.endswith("/tiny-Q4_K_M.gguf")
            assert open(path, "rb").read() == tiny_gguf
            assert httpx.get(srv.url + "/v1/models").json()["data"][0]["id"] == "local/tiny"  # llama-server's name
            r = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 3}, timeout=60)
            assert r.status_code == 200 and r.json()["tokens_predicted"] >= 1
        finally:
            srv.stop()
        log = srv.log_path.read_text()
        assert hub.downloads("tiny-Q4_K_M.gguf") == 1 and hub.downloads("tiny-Q8_0.gguf") == 0
        assert hub.downloads("mmproj-tiny-f16.gguf") == 0
        assert "100%" in log  # huggingface_hub's progress bar
        assert hub.auth and set(hub.auth) == {"Bearer hf_secret"}  # HF_TOKEN reached the Hub
        # -hff and --hf-token: that file, that token
        srv = _server(["-hf", "local/tiny:Q4_K_M", "-hff", "tiny-Q8_0.gguf", "--hf-token", "hf_other", "--no-mmproj"], tmp_path,
                      env, "hff")
        try:
            srv.wait_ready(120)
            assert httpx.get(srv.url + "/props").json()["model_path"].endswith("/tiny-Q8_0.gguf")
        finally:
            srv.stop()
        assert hub.downloads("tiny-Q8_0.gguf") == 1 and "Bearer hf_other" in hub.auth
        n_requests = len(hub.requests)
    # the Hub is gone: --offline starts from the cache
    srv = _server(["-hf", "local/tiny", "--offline"], tmp_path, env, "offline")
    try:
        srv.wait_ready(120)
        assert httpx.get(srv.url + "/props").json()["model_path"] == path
        r = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 3}, timeout=60)
        assert r.status_code == 200
    finally:
        srv.stop()
    assert len(hub.requests) == n_requests
    # offline, a file that was never downloaded is a clear error
    srv = _server(["-hf", "local/tiny:IQ2_XS", "--offline"], tmp_path, env, "missing")
    assert srv.proc.wait(60) == 1
    srv.stop()
    assert "failed to fetch model metadata: no GGUF files found in repository for tag 'IQ2_XS'" in srv.log_path.read_text()
    # without --offline and without a Hub, the cached listing is used, as llama.cpp does
    srv = _server(["-hf", "local/tiny"], tmp_path, dict(env, HF_ENDPOINT="http://127.0.0.1:9"), "no-hub")
    try:
        srv.wait_ready(120)
        assert httpx.get(srv.url + "/props").json()["model_path"] == path
    finally:
        srv.stop()

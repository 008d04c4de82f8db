"""Router mode without a server: where models come from (runtime/launch/model_sources.py: the
Hugging Face cache as llama.cpp lays it out, --models-dir, --models-preset INI files), how a preset
becomes a worker's command line (api/router_args.py) and when `tritium-server` is a router
(api/router_cli.py)."""
from __future__ import annotations

import pytest

from api.cli_args import OPTIONS, build_parser
from api.router_args import OptionTable
from api.router_cli import is_router_mode
from runtime.launch.model_sources import (ModelSource, PresetError, cached_mmproj, cached_models, collect_presets,
                                          load_ini, mmproj_inputs,
                                          load_models_dir, remove_cached, resolve_cached)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def table() -> OptionTable:
    return OptionTable(OPTIONS)


def _cache_repo(root, repo: str, files: list[str], ref: str = "main", commit: str = COMMIT):
    d = root / ("models--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    (d / "refs" / ref).write_text(commit)
    snap = d / "snapshots" / commit
    for f in files:
        (snap / f).parent.mkdir(parents=True, exist_ok=True)
        (snap / f).write_bytes(b"GGUF")
    return snap


def test_hf_cache_listing_follows_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path))
    _cache_repo(tmp_path, "ggml-org/tinygemma3-GGUF", ["tinygemma3-Q8_0.gguf", "mmproj-tinygemma3.gguf"])
    _cache_repo(tmp_path, "ggml-org/models", ["bert-bge-small/ggml-model-f16.gguf", "x/ggml-model-q8_0.gguf"])
    snap = _cache_repo(tmp_path, "u/split", ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf",
                                             "README.md", "notag.gguf"])
    _cache_repo(tmp_path, "u/noref", ["a-F16.gguf"], commit="nothex")  # an invalid ref: skipped
    (tmp_path / "models--bad_name").mkdir()
    assert cached_models() == ["ggml-org/models:F16", "ggml-org/models:Q8_0", "ggml-org/tinygemma3-GGUF:Q8_0",
                               "u/split:Q4_K_M"]
    assert resolve_cached("u/split:Q4_K_M") == snap / "m-Q4_K_M-00001-of-00002.gguf"
    assert resolve_cached("ggml-org/models:q8_0").name == "ggml-model-q8_0.gguf"
    assert resolve_cached("u/split:Q8_0") is None and resolve_cached("nobody/here") is None
    assert remove_cached("ggml-org/models:F16") and cached_models()[0] == "ggml-org/models:Q8_0"
    assert remove_cached("u/split") and "u/split:Q4_K_M" not in cached_models()


def test_models_dir_scan(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "mmproj-a.gguf").write_bytes(b"")  # a companion file: not a model
    (tmp_path / "notes.txt").write_bytes(b"")
    sub = tmp_path / "vision"
    sub.mkdir()
    for f in ("model-Q4.gguf", "mmproj-f16.gguf", "mtp-draft.gguf"):
        (sub / f).write_bytes(b"")
    split = tmp_path / "big"
    split.mkdir()
    for f in ("big-00001-of-00002.gguf", "big-00002-of-00002.gguf"):
        (split / f).write_bytes(b"")
    (tmp_path / "empty").mkdir()
    got = load_models_dir(str(tmp_path))
    assert sorted(got) == ["a", "big", "vision"]
    assert got["a"].options == {"model": str(tmp_path / "a.gguf")} and got["a"].source is ModelSource.MODELS_DIR
    assert got["big"].options["model"].endswith("big-00001-of-00002.gguf")
    assert got["vision"].options == {"model": str(sub / "model-Q4.gguf"), "mmproj": str(sub / "mmproj-f16.gguf"),
                                     "model-draft": str(sub / "mtp-draft.gguf")}
    with pytest.raises(PresetError, match="does not exist or is not a directory"):
        load_models_dir(str(tmp_path / "nope"))


def test_ini_presets(tmp_path, table):
    ini = tmp_path / "p.ini"
    ini.write_text("version = 1\n; comment\n[*]\nctx-size = 512\n\n[chat]  # trailing comment\nm = /m/chat.gguf\n"
                   "alias = c1, c2\nno-jinja = 1\nLLAMA_ARG_N_PREDICT = 8\nload-on-startup = true\n"
                   "[user/repo:q4_k_m]\nhf-repo = user/repo:Q4_K_M\n")
    glob, presets = load_ini(str(ini), table.canon)
    assert glob == {"ctx-size": "512"}
    assert presets["chat"].options == {"model": "/m/chat.gguf", "alias": "c1, c2", "jinja": "false",
                                       "n-predict": "8", "load-on-startup": "true"}
    assert "user/repo:Q4_K_M" in presets  # the section's tag made canonical, as b1
    ini.write_text("[a]\nnot-a-flag = 1\n")
    with pytest.raises(PresetError, match="option 'not-a-flag' not recognized in preset 'a'"):
        load_ini(str(ini), table.canon)
    ini.write_text("[a\n")
    with pytest.raises(PresetError, match="failed to parse"):
        load_ini(str(ini), table.canon)
    with pytest.raises(PresetError, match="preset file does not exist"):
        load_ini(str(tmp_path / "none.ini"), table.canon)


def test_sources_cascade(tmp_path, monkeypatch, table):
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    _cache_repo(tmp_path / "cache", "u/r", ["r-Q8_0.gguf"])
    d = tmp_path / "dir"
    d.mkdir()
    (d / "local.gguf").write_bytes(b"")
    ini = tmp_path / "p.ini"
    ini.write_text("[*]\nctx-size = 64\n[local]\nn-predict = 4\n[extra]\nmodel = /x.gguf\n"
                   "[dedup]\nhf-repo = u/r:Q8_0\ndedup-cache-models = 1\n")
    final, hidden = collect_presets(str(d), str(ini), {"ctx-size": "256", "temp": "0"}, table.canon)
    assert sorted(final) == ["dedup", "extra", "local", "u/r:Q8_0"]
    # the router's own command line wins over everything (b1 merges base_preset last)
    assert final["local"].options == {"model": str(d / "local.gguf"), "ctx-size": "256", "n-predict": "4", "temp": "0"}
    assert final["local"].source is ModelSource.PRESET and final["u/r:Q8_0"].source is ModelSource.CACHE
    assert hidden == {"u/r:Q8_0"}


def test_option_table_renders_worker_arguments(table):
    argv = ["--port", "8080", "-c", "1024", "--temp=0", "--no-jinja", "--slots", "--api-key", "k", "-m", "x.gguf",
            "--models-dir", "d", "--unknown-thing"]
    opts = table.options_of_argv(argv)
    assert opts == {"port": "8080", "ctx-size": "1024", "temperature": "0", "jinja": "false", "slots": "true",
                    "api-key": "k", "model": "x.gguf", "models-dir": "d"}
    args = table.render({"model": "/m.gguf", "ctx-size": "64", "jinja": "false", "slots": "true", "metrics": "0"})
    assert args == ["--model", "/m.gguf", "--ctx-size", "64", "--no-jinja", "--slots"]  # metrics off: no flag
    assert table.canon("c", "7") == ("ctx-size", "7") and table.canon("no-slots", "true") == ("slots", "false")
    assert table.canon("bogus", "1") is None


def test_router_mode_decision(monkeypatch, tmp_path):
    p = build_parser()
    monkeypatch.delenv("TRITIUM_DEFAULT_MODEL", raising=False)
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path))
    assert not is_router_mode(p.parse_args(["-m", "x.gguf", "--models-dir", "d"]))  # a model: never a router
    assert is_router_mode(p.parse_args(["--models-dir", "d"]))
    assert is_router_mode(p.parse_args(["--models-preset", "p.ini"]))
    assert not is_router_mode(p.parse_args([]))  # nothing to route to: the default (or built-in) model
    _cache_repo(tmp_path, "u/r", ["r-Q8_0.gguf"])
    assert is_router_mode(p.parse_args([]))  # llama.cpp's cache holds a model: a router, as llama-server
    assert not is_router_mode(p.parse_args(["-hf", "u/r:Q8_0"]))
    monkeypatch.setenv("TRITIUM_DEFAULT_MODEL", "builtin")
    assert not is_router_mode(p.parse_args([]))  # the built-in model asked for
    assert is_router_mode(p.parse_args(["--models-dir", "d"]))


def test_cached_projector_and_its_inputs(tmp_path, monkeypatch):
    """A cached VLM's worker gets the repository's mmproj (b1's find_best_mmproj, the one -hf uses:
    same folder or above, the deepest, then the closest quant width to the model's; -hff's file
    counts as the model) and /models says what it takes in."""
    from gguf import GGUFValueType, GGUFWriter

    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path))
    snap = _cache_repo(tmp_path, "u/vlm", ["vlm-Q4_K_M.gguf", "vlm-Q8_0.gguf", "mmproj-vlm-f16.gguf",
                                           "mmproj-vlm-Q8_0.gguf", "deeper/mmproj-x-f16.gguf"])
    assert resolve_cached("u/vlm:Q8_0").name == "vlm-Q8_0.gguf"
    assert cached_mmproj("u/vlm:Q8_0") == snap / "mmproj-vlm-Q8_0.gguf"  # the matching quant
    assert cached_mmproj("u/vlm:Q4_K_M") == snap / "mmproj-vlm-Q8_0.gguf"  # 8 bits closer to 4 than 16
    assert cached_mmproj("u/vlm", "vlm-Q8_0.gguf") == snap / "mmproj-vlm-Q8_0.gguf"
    assert cached_mmproj("u/vlm", "nope.gguf") is None
    _cache_repo(tmp_path, "u/text", ["t-Q8_0.gguf"])
    assert cached_mmproj("u/text:Q8_0") is None
    proj = tmp_path / "p.gguf"
    w = GGUFWriter(str(proj), "clip")
    w.add_key_value("clip.has_vision_encoder", True, GGUFValueType.BOOL)
    w.add_key_value("clip.has_audio_encoder", True, GGUFValueType.BOOL)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    assert mmproj_inputs(proj) == ["text", "image", "audio"]
    assert mmproj_inputs(snap / "mmproj-vlm-f16.gguf") == ["text"]  # not a GGUF: nothing more

"""Where a router (`tritium-server` without `-m`) finds its models, as llama-server b1-0c1e570's
`server_models::load_models` (tools/server/server-models.cpp, common/preset.cpp) does:

1. the Hugging Face cache llama.cpp uses (`LLAMA_CACHE`, `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
   `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub`): one model per
   repository and quant tag (`user/repo:Q8_0`), the `refs/main` snapshot (else any ref);
2. `--models-dir DIR`: each `*.gguf` in DIR (named by its file name without `.gguf`) and each
   sub-folder holding one (named by the folder; `mmproj` files and `-00001-of-` shards as b1);
3. `--models-preset FILE.ini`: one `[name]` section per model, `key = value` lines whose keys are
   llama-server's option names without dashes (`[*]` applies to every model).

A later source overrides an earlier one for the same name; the router's own command line is laid
over every model last. A preset is plain data: `{option key: value}`, keys made canonical by the
`canon` callback the caller gives (api/router_args.py knows the flags).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable

from runtime.launch.hf_download import find_best_mmproj, find_best_model

__all__ = ["ModelSource", "ModelPreset", "PresetError", "hf_cache_dir", "cached_models", "resolve_cached",
           "cached_mmproj", "mmproj_inputs",
           "remove_cached", "load_models_dir", "load_ini", "collect_presets",
           "LOAD_ON_STARTUP", "STOP_TIMEOUT", "DEDUP_CACHE_MODELS", "PRESET_ONLY"]

# preset-only keys (common/arg.cpp common_params_add_preset_options): never passed to a worker
LOAD_ON_STARTUP, STOP_TIMEOUT, DEDUP_CACHE_MODELS = "load-on-startup", "stop-timeout", "dedup-cache-models"
PRESET_ONLY = (LOAD_ON_STARTUP, STOP_TIMEOUT, DEDUP_CACHE_MODELS)
MODEL, HF_REPO, HF_FILE, MMPROJ, DRAFT_HF, DRAFT_MODEL = "model", "hf-repo", "hf-file", "mmproj", "hf-repo-draft", \
    "model-draft"  # (b1's keys: an option's last spelling, api/router_args.py)
MMPROJ_AUTO = "mmproj-auto"  # false: --no-mmproj

Canon = Callable[[str, str], "tuple[str, str] | None"]  # (key, value) -> (canonical key, value) | None: unknown


class PresetError(Exception):
    pass


class ModelSource(Enum):
    PRESET = "preset"
    MODELS_DIR = "models_dir"
    CACHE = "cache"


@dataclass
class ModelPreset:
    name: str
    source: ModelSource
    options: dict[str, str] = field(default_factory=dict)  # canonical option key -> value, in order


# ---- the Hugging Face cache (common/hf-cache.cpp) -------------------------------------------------

_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
_REPO_ID = re.compile(r"^[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{40}$")
_NOT_LISTED = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")


def hf_cache_dir() -> Path:
    for var, sub in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub"),
                     ("XDG_CACHE_HOME", "huggingface/hub")):
        base = os.environ.get(var)
        if base:
            return Path(base) / sub if sub else Path(base)
    return Path.home() / ".cache" / "huggingface" / "hub"


def _split_tag(path: str) -> tuple[str, str, int]:
    """(prefix, TAG, part index) of a GGUF path (b1 get_gguf_split_info); ("", "", 0) if not one."""
    if not path.endswith(".gguf"):
        return "", "", 0
    prefix, index = path[:-5], 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index = m.group(1), int(m.group(2))
    t = _TAG.search(prefix)
    return prefix, (t.group(1).upper() if t else ""), index


def _snapshot(repo_dir: Path) -> Path | None:
    refs = repo_dir / "refs"
    if not refs.is_dir():
        return None
    fallback = None
    for ref in sorted(refs.iterdir()):
        try:
            commit = ref.read_text(encoding="utf-8").splitlines()[0].strip() if ref.is_file() else ""
        except (OSError, IndexError):
            continue
        if not _COMMIT.match(commit):
            continue
        if ref.name == "main":
            fallback = commit
            break
        fallback = fallback or commit
    snap = repo_dir / "snapshots" / fallback if fallback else None
    return snap if snap is not None and snap.is_dir() else None


def _cached_files(repo: str | None = None) -> list[tuple[str, str, Path]]:
    """(repo id, path in the repository, local path) of every cached file (of `repo` only)."""
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or not d.name.startswith("models--"):
            continue
        rid = d.name[len("models--"):].replace("--", "/")
        if not _REPO_ID.match(rid) or (repo is not None and rid != repo):
            continue
        snap = _snapshot(d)
        if snap is None:
            continue
        for p in sorted(snap.rglob("*")):
            if p.is_file() or p.is_symlink():
                out.append((rid, p.relative_to(snap).as_posix(), p))
    return out


def cached_models() -> list[str]:
    """`user/repo:TAG` of every cached model (first parts only; no mmproj, no draft heads)."""
    seen: list[str] = []
    for rid, rel, _ in _cached_files():
        prefix, tag, index = _split_tag(rel)
        if index != 1 or not tag or any(k in prefix for k in _NOT_LISTED):
            continue
        if f"{rid}:{tag}" not in seen:
            seen.append(f"{rid}:{tag}")
    return seen


def resolve_cached(repo_tag: str, hf_file: str = "") -> Path | None:
    """The cached file `-hf repo[:tag]` (`-hff`) would load, None when it is not cached."""
    repo, _, tag = repo_tag.partition(":")
    files = {rel: p for _, rel, p in _cached_files(repo)}
    if hf_file:
        return files.get(hf_file)
    best = find_best_model(list(files), tag)
    return files[best] if best else None


def cached_mmproj(repo_tag: str, hf_file: str = "") -> Path | None:
    """The cached projector `-hf repo[:tag]` (`-hff`) brings along: hf_download.find_best_mmproj
    over the repository's cached files, as b1's update_caps (common_download_get_hf_plan offline)."""
    repo, _, tag = repo_tag.partition(":")
    files = {rel: p for _, rel, p in _cached_files(repo)}
    model = hf_file if hf_file in files else None if hf_file else find_best_model(list(files), tag)
    best = find_best_mmproj(list(files), model) if model else None
    return files[best] if best else None


def mmproj_inputs(path: str | os.PathLike) -> list[str]:
    """`GET /models` input modalities of a model served with this projector (mtmd_get_cap_from_file:
    the header's clip.has_vision_encoder / has_audio_encoder); an unreadable file adds nothing."""
    from runtime.model.gguf import read_gguf_metadata

    try:
        md = read_gguf_metadata(path)
    except Exception:  # noqa: BLE001 - as b1: a warning's worth, no capability
        return ["text"]
    return ["text"] + (["image"] if md.get("clip.has_vision_encoder") else []) + \
        (["audio"] if md.get("clip.has_audio_encoder") else [])


def remove_cached(repo_tag: str) -> bool:
    """Deletes a cached model's files (its tag's, else the whole repository); whether anything went."""
    import shutil

    repo, _, tag = repo_tag.partition(":")
    if not _REPO_ID.match(repo):
        return False
    if not tag:
        d = hf_cache_dir() / ("models--" + repo.replace("/", "--"))
        shutil.rmtree(d, ignore_errors=True)
        return not d.exists()
    doomed = [p for _, rel, p in _cached_files(repo) if _split_tag(rel)[1] == tag.upper()]
    blobs = {os.path.normpath(p.parent / os.readlink(p)) for p in doomed if p.is_symlink()}
    for p in doomed:
        p.unlink(missing_ok=True)
    kept = {os.path.normpath(p.parent / os.readlink(p)) for _, _, p in _cached_files(repo) if p.is_symlink()}
    for b in blobs - kept:  # the blobs no other snapshot entry points at
        Path(b).unlink(missing_ok=True)
    return bool(doomed)


# ---- --models-dir (common/preset.cpp load_from_models_dir) ----------------------------------------

_DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")


def load_models_dir(models_dir: str) -> dict[str, ModelPreset]:
    root = Path(models_dir)
    if not root.is_dir():
        raise PresetError(f"error: '{models_dir}' does not exist or is not a directory")
    out: dict[str, ModelPreset] = {}
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        opts: dict[str, str] = {}
        if entry.is_dir():
            model = shard = mmproj = draft = ""
            for f in sorted(entry.iterdir(), key=lambda p: p.name):
                if not f.name.endswith(".gguf") or f.is_dir():
                    continue
                if "mmproj" in f.name:
                    mmproj = str(f)
                elif f.name.startswith(_DRAFT_PREFIXES):
                    draft = draft or str(f)
                elif "-00001-of-" in f.name:
                    shard = str(f)
                else:
                    model = str(f)
            if not (shard or model):
                continue
            opts[MODEL] = shard or model
            if mmproj:
                opts[MMPROJ] = mmproj
            if draft:
                opts[DRAFT_MODEL] = draft
        elif entry.name.endswith(".gguf") and "mmproj" not in entry.name and not entry.name.startswith(_DRAFT_PREFIXES):
            opts[MODEL] = str(entry)
        else:
            continue
        name = entry.name.replace(".gguf", "") if not entry.is_dir() else entry.name
        out[name] = ModelPreset(name, ModelSource.MODELS_DIR, opts)
    return out


# ---- --models-preset FILE.ini (common/preset.cpp load_from_ini) ------------------------------------

_HEADER = re.compile(r"^[ \t]*\[[ \t]*([^\]]*?)[ \t]*\][ \t]*(?:[;#].*)?$")
_KV = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?$")
_SKIP = re.compile(r"^[ \t]*(?:[;#].*)?$")


def _canonical_tag(section: str) -> str:
    name, colon, tag = section.rpartition(":")
    if not colon:
        return section
    m = _TAG.search(tag)
    return f"{name}:{(m.group(1) if m else tag).upper()}"


def load_ini(path: str, canon: Canon) -> tuple[dict[str, str], dict[str, ModelPreset]]:
    """(the `[*]` options, the presets) of an INI file; unknown keys and bad lines raise PresetError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise PresetError(f"preset file does not exist: {path}") from None
    except OSError:
        raise PresetError(f"failed to open server preset file: {path}") from None
    sections: dict[str, dict[str, str]] = {}
    current = "default"
    for line in re.split(r"\r\n|\n|\r", text):
        if _SKIP.match(line):
            continue
        if m := _HEADER.match(line):
            current = m.group(1)
            sections[current] = {}
        elif m := _KV.match(line.lstrip(" \t")):
            sections.setdefault(current, {})[m.group(1)] = m.group(2)
        else:
            raise PresetError(f"failed to parse server config file: {path}")
    glob: dict[str, str] = {}
    out: dict[str, ModelPreset] = {}
    for section, kv in sections.items():
        name = section if section in ("*", "default") else _canonical_tag(section)
        opts: dict[str, str] = {}
        for key, value in kv.items():
            if key == "version":
                continue
            if key in PRESET_ONLY:
                opts[key] = value
                continue
            c = canon(key, value)
            if c is None:
                raise PresetError(f"option '{key}' not recognized in preset '{name}'")
            opts[c[0]] = c[1]
        if name == "default" and not opts:
            continue
        if name == "*":
            glob = opts
        else:
            out[name] = ModelPreset(name, ModelSource.PRESET, opts)
    return glob, out


def _truthy(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "on", "yes", "enabled")


def collect_presets(models_dir: str | None, preset_file: str | None, base: dict[str, str],
                    canon: Canon) -> tuple[dict[str, ModelPreset], set[str]]:
    """Every model of every source, cascaded as b1 (`[*]`, then the model's own options, then the
    router's command line `base` over all); and the cache entries a `dedup-cache-models` preset hides."""
    cached = {n: ModelPreset(n, ModelSource.CACHE, {HF_REPO: n}) for n in cached_models()}
    local = load_models_dir(models_dir) if models_dir else {}
    glob, custom = load_ini(preset_file, canon) if preset_file else ({}, {})
    final: dict[str, ModelPreset] = {}
    for group in (cached, local):
        for n, p in group.items():
            final[n] = ModelPreset(n, p.source, {**glob, **p.options})
    for n, p in custom.items():
        prev = final.get(n)
        opts = {**(prev.options if prev else glob), **p.options}
        final[n] = ModelPreset(n, ModelSource.PRESET, opts)
    for p in final.values():
        p.options.update(base)
    hidden: set[str] = set()
    dedup_paths = set()
    for n, p in custom.items():
        opts = {**glob, **p.options}
        if not _truthy(opts.get(DEDUP_CACHE_MODELS, "0")):
            continue
        for repo_key, file_key in ((HF_REPO, HF_FILE), (DRAFT_HF, DRAFT_MODEL)):
            if opts.get(repo_key):
                path = resolve_cached(opts[repo_key], opts.get(file_key, "") if file_key == HF_FILE else "")
                if path is not None:
                    dedup_paths.add(path)
    if dedup_paths:
        for n in cached:
            if final[n].source is ModelSource.CACHE and resolve_cached(n) in dedup_paths:
                hidden.add(n)
    return final, hidden

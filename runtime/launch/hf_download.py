"""`-hf user/repo[:quant]`, `-hff FILE`: a model from the Hugging Face Hub, as llama-server picks it.

llama.cpp's rules (common/download.cpp `common_download_get_hf_plan`, `find_best_model`):
- `user/repo[:tag]`: the part after the last `:` is the quant tag; the repo must be `user/model`.
- With `-hff FILE`: exactly that path in the repository (else an error that lists the GGUF files).
- Otherwise the first model GGUF (not mmproj, imatrix, mtp-, eagle3-, dflash-, dspark-) whose path
  matches `TAG[.-]` (case-insensitive) for the tag given, or for Q4_K_M then Q8_0 without one;
  without a tag, else the first model GGUF. Of a split model (`-00001-of-0000N.gguf`) only the first
  part is picked, and then every part is downloaded.
- With the model, its multimodal projector (unless --no-mmproj, --mmproj or -mmu): the GGUF with
  `mmproj` in its path, in the model's folder or one above it, the deepest, then the one whose quant
  bits are closest to the model's (`find_best_sibling`).
- The files are listed at the repository's `main` branch in the order the Hub returns them; when
  the listing fails (or `--offline`) the files cached for `main` are used instead.

Downloads go through `huggingface_hub` into its cache (`HF_HUB_CACHE` / `HF_HOME`, the same layout
llama.cpp uses), with its progress bar; `--offline` reads only that cache. The endpoint is
`MODEL_ENDPOINT` or `HF_ENDPOINT` (llama.cpp's order), the token `--hf-token` or `HF_TOKEN`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HfModelRequest", "HfDownloadError", "split_repo_tag", "pick_files", "find_best_mmproj", "download_model",
           "download_files"]

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)


class HfDownloadError(Exception):
    pass


@dataclass(frozen=True)
class HfModelRequest:
    repo: str                    # "user/repo[:tag]" as given to -hf
    file: str | None = None      # -hff
    token: str | None = None     # --hf-token / HF_TOKEN
    offline: bool = False        # --offline
    endpoint: str | None = None  # None: MODEL_ENDPOINT, HF_ENDPOINT, else huggingface.co
    cache_dir: str | None = None  # None: huggingface_hub's (HF_HUB_CACHE / HF_HOME)


def split_repo_tag(value: str) -> tuple[str, str]:
    parts = value.split(":")
    tag = parts[-1] if len(parts) > 1 else ""
    repo = parts[0]
    if len(repo.split("/")) != 2:
        raise HfDownloadError("invalid HF repo format, expected <user>/<model>[:quant]")
    return repo, tag


def _split_info(path: str) -> tuple[str, int, int] | None:
    """(prefix, index, count) of a GGUF path, None when it is not one."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[:-5]
    m = _SPLIT.match(prefix)
    if m:
        return m.group(1), int(m.group(2)), int(m.group(3))
    return prefix, 1, 1


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(k in name for k in _NOT_MODEL)


def _first_part(path: str) -> bool:
    info = _split_info(path)
    return info is not None and not (info[2] > 1 and info[1] != 1)


def find_best_model(files: list[str], tag: str) -> str | None:
    for t in ([tag] if tag else DEFAULT_TAGS):
        pattern = re.compile(re.escape(t) + r"[.-]", re.I)
        for f in files:
            if is_model_file(f) and pattern.search(f) and _first_part(f):
                return f
    if not tag:
        for f in files:
            if is_model_file(f) and _first_part(f):
                return f
    return None


def pick_files(files: list[str], tag: str = "", hf_file: str | None = None) -> list[str]:
    """The files to download for a repository listing: the model (all parts of a split one)."""
    if hf_file:
        primary = hf_file if hf_file in files else None
        if primary is None:
            raise HfDownloadError(f"file '{hf_file}' not found in repository" + _available(files))
    else:
        primary = find_best_model(files, tag)
        if primary is None:
            raise HfDownloadError("no GGUF files found in repository" + (f" for tag '{tag}'" if tag else "")
                                  + _available(files))
    info = _split_info(primary)
    if info is None or info[2] <= 1:
        return [primary]
    return [f for f in files if (s := _split_info(f)) is not None and s[0] == info[0] and s[2] == info[2]]


def _quant_bits(path: str) -> int:
    """extract_quant_bits: the first number of the file's quant tag (Q4_K_M -> 4, F16 -> 16), else 0."""
    info = _split_info(path)
    t = _TAG.search(info[0]) if info else None
    m = re.search(r"[0-9]+", t.group(1)) if t else None
    return int(m.group(0)) if m else 0


def find_best_mmproj(files: list[str], model: str) -> str | None:
    """llama.cpp's find_best_sibling(files, model, "mmproj") (no tag): the deepest folder shared with
    the model, then the closest quant bits; the first in the listing's order on a tie."""
    bits, folder = _quant_bits(model), model.split("/")[:-1]
    best, best_key = None, (-1, 0)
    for f in files:
        if not f.endswith(".gguf") or "mmproj" not in f:
            continue
        own = f.split("/")[:-1]
        if own != folder[:len(own)]:  # not in the model's folder or one above it
            continue
        depth, diff = len(own), abs(_quant_bits(f) - bits)
        if best is None or depth > best_key[0] or (depth == best_key[0] and diff < best_key[1]):
            best, best_key = f, (depth, diff)
    return best


def _available(files: list[str]) -> str:
    ggufs = [f for f in files if f.endswith(".gguf")]
    return "; available GGUF files: " + ", ".join(ggufs) if ggufs else ""


def _endpoint(req: HfModelRequest) -> str | None:
    e = req.endpoint or os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT")
    return e.rstrip("/") if e else None


def _cached_files(repo: str, cache_dir: str | None = None) -> list[str]:
    """The files cached for the repository's `main` (huggingface_hub's cache layout)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    folder = Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    try:
        commit = (folder / "refs" / "main").read_text().strip()
    except OSError:
        return []
    snap = folder / "snapshots" / commit
    return sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())


def list_files(req: HfModelRequest, repo: str, log=None) -> list[str]:
    if not req.offline:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        try:
            api = HfApi(endpoint=_endpoint(req), token=req.token or None)
            files = [e.path for e in api.list_repo_tree(repo, recursive=True, revision="main")
                     if isinstance(e, RepoFile)]
            if files:
                return files
        except Exception as e:  # noqa: BLE001 - as llama.cpp: fall back to the cache
            if log:
                log(f"could not list {repo} on the Hub ({type(e).__name__}: {e}); trying the cache")
    return _cached_files(repo, req.cache_dir)


def _progress_bar():
    """huggingface_hub's bar shows only on a terminal; llama-server shows its bar in logs too. This
    one always shows (unless HF_HUB_DISABLE_PROGRESS_BARS=1), redrawn at most once a second."""
    from huggingface_hub.utils import are_progress_bars_disabled
    from tqdm import tqdm

    class Progress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = are_progress_bars_disabled()
            kwargs.setdefault("mininterval", 1.0)
            super().__init__(*args, **kwargs)

    return Progress


def download_model(req: HfModelRequest, log=None) -> Path:
    """Downloads (or finds in the cache) the model `req` names; returns the local path of its
    first file. Raises HfDownloadError in the user's terms."""
    return download_files(req, log)[0]


def download_files(req: HfModelRequest, log=None, mmproj: bool = False) -> tuple[Path, Path | None]:
    """`download_model`, and with `mmproj` the model's projector when the repository has one:
    (the model's first file, the projector's or None)."""
    from huggingface_hub import hf_hub_download

    repo, tag = split_repo_tag(req.repo)
    files = list_files(req, repo, log)
    if not files:
        raise HfDownloadError(f"no files found for {repo}" + (" in the cache (offline mode)" if req.offline
                                                               else " on the Hub nor in the cache"))
    chosen = pick_files(files, tag, req.file)
    proj = find_best_mmproj(files, chosen[0]) if mmproj else None
    paths = []
    for f in chosen + ([proj] if proj else []):
        try:
            paths.append(Path(hf_hub_download(repo, f, revision="main", endpoint=_endpoint(req), cache_dir=req.cache_dir,
                                              token=req.token or None, local_files_only=req.offline,
                                              tqdm_class=_progress_bar())))
        except Exception as e:  # noqa: BLE001 - reported as the download failure it is
            where = "is not available in cache (offline mode)" if req.offline else "could not be downloaded"
            raise HfDownloadError(f"{repo}/{f} {where}: {type(e).__name__}: {e}") from e
    return paths[0], paths[-1] if proj else None


def main(argv: list[str] | None = None) -> int:
    """`python -m runtime.launch.hf_download user/repo[:quant] [-hff FILE]`: download (or find in the cache)
    what `tritium-server -hf` would load, print its path and exit; a Kubernetes init container
    fills the cache this way (deploy/overlays/hf) so that the server starts with `--offline`."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m runtime.launch.hf_download", description=main.__doc__)
    p.add_argument("repo", metavar="<user>/<model>[:quant]")
    p.add_argument("-hff", "--hf-file", default=None)
    p.add_argument("-hft", "--hf-token", default=None)
    p.add_argument("--offline", action="store_true")
    a = p.parse_args(argv)
    req = HfModelRequest(a.repo, file=a.hf_file, token=a.hf_token or os.environ.get("HF_TOKEN"), offline=a.offline)
    try:
        print(download_model(req, log=lambda m: print(m, file=sys.stderr)))
    except HfDownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Media in requests, as llama-server b1-0c1e570 reads them (tools/server/server-common.cpp
`handle_media`, `oaicompat_content_load_media`, `base64_decode`): the bytes of each image / audio
part of a chat message, the part replaced by a `media_marker` text part; `multimodal_data` of a
`/completion` prompt object. Bytes only: decoding and resizing pixels is the runtime's.

- `data:image/...;base64,...` (also `data:audio/`, `data:video/`): base64 after the comma;
- `http://...`: fetched as llama-server fetches it (10 MB at most, 10 s, redirects followed; a
  failed connection is its 500 "error: cannot make GET request", another status than 2xx its
  "Failed to download image"); `https://...` is the 500 of the reference build, which has no TLS;
- `file://...`: only with `--media-path` (a 400 otherwise), a file name inside that folder;
- anything else: raw base64 (a 500 "Invalid base64 value" when it decodes to nothing).
"""
from __future__ import annotations

import os
import string
import urllib.error
import urllib.request
from typing import Any

from api.errors import ApiError

__all__ = ["base64_decode", "load_url", "content_load_media", "MEDIA_KINDS"]

MEDIA_KINDS = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}
_B64 = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
_B64_INDEX = {c: i for i, c in enumerate(_B64)}
_MAX_MEDIA_FILE = 64 << 20  # a local file read with --media-path (the body limit bounds the rest)
_MAX_DOWNLOAD, _DOWNLOAD_TIMEOUT = 10 << 20, 10.0  # llama-server's common_remote_params for media
_NO_TLS = ("HTTPS is not supported. Please rebuild with one of:\n  -DLLAMA_BUILD_BORINGSSL=ON\n"
           "  -DLLAMA_BUILD_LIBRESSL=ON\n  -DLLAMA_OPENSSL=ON (default, requires OpenSSL dev files installed)")


def base64_decode(s: str) -> bytes:
    """b1's base64_decode: characters up to the first '=' or non-base64 one, a trailing partial
    group decoded as far as it goes."""
    n = 0
    for c in s:
        if c == "=" or c not in _B64_INDEX:
            break
        n += 1
    vals = [_B64_INDEX[c] for c in s[:n]]
    out = bytearray()
    full = n - n % 4
    for i in range(0, full, 4):
        a, b, c, d = vals[i:i + 4]
        out += bytes((((a << 2) + ((b & 0x30) >> 4)) & 0xFF, (((b & 0xF) << 4) + ((c & 0x3C) >> 2)) & 0xFF,
                      (((c & 0x3) << 6) + d) & 0xFF))
    rest = n - full
    if rest:
        a, b, c, d = (vals[full:] + [0, 0, 0, 0])[:4]
        tail = bytes((((a << 2) + ((b & 0x30) >> 4)) & 0xFF, (((b & 0xF) << 4) + ((c & 0x3C) >> 2)) & 0xFF,
                      (((c & 0x3) << 6) + d) & 0xFF))
        out += tail[:rest - 1]
    return bytes(out)


def _valid_file_name(name: str) -> bool:
    """A relative path inside --media-path (fs_validate_filename with directories allowed): no
    absolute path, no '..' component, no control characters."""
    if not name or len(name) > 4096 or name.startswith(("/", "\\")):
        return False
    if any(ord(ch) < 32 for ch in name) or ":" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.replace("\\", "/").split("/"))


def _server_error(message: str) -> ApiError:
    return ApiError(message, "server_error", 500)


def download(url: str) -> bytes:
    """common_remote_get_content(url) for a media part (common/http.h's URL rules and messages)."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        raise _server_error("invalid URL: no scheme")
    scheme = url[:scheme_end]
    if scheme not in ("http", "https"):
        raise _server_error(f"unsupported URL scheme: {scheme}")
    rest = url[scheme_end + 3:]
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    if not host or host.startswith(":"):
        raise _server_error("error: invalid URL format")
    if scheme == "https":
        raise _server_error(_NO_TLS)
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "llama-cpp/b1-tritium"})
        with urllib.request.urlopen(req, timeout=_DOWNLOAD_TIMEOUT) as r:
            status = r.status
            data = r.read(_MAX_DOWNLOAD + 1)
    except urllib.error.HTTPError as e:
        status, data = e.code, b""
    except (OSError, ValueError):
        raise _server_error("error: cannot make GET request") from None
    if len(data) > _MAX_DOWNLOAD:  # llama-server's receiver stops the transfer: no response
        raise _server_error("error: cannot make GET request")
    if not 200 <= status < 300:
        raise _server_error("Failed to download image")
    return data


def load_url(url: str, media_path: str = "") -> bytes:
    """handle_media: the bytes a part's URL names (see the module docstring)."""
    if url.startswith("http"):
        return download(url)
    if url.startswith("file://"):
        if not media_path:
            raise ApiError("file:// URLs are not allowed unless --media-path is specified")
        name = url[7:]
        if not _valid_file_name(name):
            raise ApiError(f"file path is not allowed: {name}")
        path = os.path.join(media_path, name)
        try:
            if os.path.getsize(path) > _MAX_MEDIA_FILE:
                raise ApiError(f"file is too large: {name}")
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            raise ApiError(f"file does not exist or cannot be opened: {name}") from None
    if url.startswith("data:"):
        parts = url.split(",")
        if len(parts) != 2:
            raise ApiError("Invalid uri-encoded base64 value")
        head = parts[0]
        if not head.startswith(("data:image/", "data:video/", "data:audio/")):
            raise ApiError(f"Invalid uri format: {head}")
        if not head.endswith("base64"):
            raise ApiError("uri must be base64 encoded")
        return base64_decode(parts[1])
    data = base64_decode(url)
    if not data:
        raise ApiError("Invalid base64 value", "server_error", 500)
    return data


def _value(obj: Any, key: str, default: Any) -> Any:
    """json_value: the key's value when present with the default's type, else the default."""
    if isinstance(obj, dict) and key in obj and isinstance(obj[key], type(default)) and obj[key] is not None:
        return obj[key]
    return default


def content_load_media(content: list, modalities: dict[str, bool], media_path: str, files: list[bytes],
                       marker: str) -> list:
    """oaicompat_content_load_media on a copy of one message's content parts: each media part's
    bytes appended to `files`, the part replaced by {"type": "media_marker", "text": marker}."""
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) and isinstance(p.get("type"), str) else ""
        if kind == "image_url":
            if not modalities.get("vision"):
                raise ApiError("image input is not supported - hint: if this is unexpected, you may need to "
                               "provide the mmproj", "server_error", 500)
            url = _value(_value(p, "image_url", {}), "url", "")
        elif kind == "input_audio":
            if not modalities.get("audio"):
                raise ApiError("audio input is not supported - hint: if this is unexpected, you may need to "
                               "provide the mmproj", "server_error", 500)
            inp = _value(p, "input_audio", {})
            url = _value(inp, "data", _value(inp, "url", ""))
        elif kind in ("input_video", "video_url"):  # decoded as llama-server decodes any file (an image, or
            if not modalities.get("video"):  # a video it cannot decode here: "Failed to load image or audio file")
                raise ApiError("video input is not supported - hint: if this is unexpected, you may need to "
                               "provide the mmproj", "server_error", 500)
            inp = _value(p, kind, {})
            url = _value(inp, "data", _value(inp, "url", ""))
        elif kind != "text":
            raise ApiError("unsupported content[].type")
        else:
            out.append(p)
            continue
        files.append(load_url(url, media_path))
        q = {k: v for k, v in p.items() if k not in ("image_url", "input_audio", "input_video", "video_url")}
        q.update({"type": "media_marker", "text": marker})
        out.append(q)
    return out

"""A local stand-in for the Hugging Face Hub (stdlib http.server): serves repositories in the Hub's
URL layout so that `huggingface_hub` itself (not a mock of it) talks to it.

- `GET /api/models/{repo}/tree/{rev}?recursive=...`: the file listing (LFS entries for binaries)
- `GET /api/models/{repo}/refs`, `GET /api/models/{repo}[/revision/{rev}]`: branches, model info
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: a file, with `X-Repo-Commit`, `ETag` (`X-Linked-Etag`
  for LFS files), `Content-Length`, `Range` support
`requests` records (method, path) of every request, `auth` the Authorization headers.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class LocalHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], commit: str = "0123456789abcdef0123456789abcdef01234567"):
        self.repos = repos
        self.commit = commit
        self.requests: list[tuple[str, str]] = []
        self.auth: list[str] = []  # Authorization headers seen
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "LocalHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def downloads(self, name: str) -> int:
        return sum(1 for m, p in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name))

    # ---- handler -------------------------------------------------------------------------
    @staticmethod
    def _lfs(name: str) -> bool:
        return name.endswith(".gguf")

    def _entry(self, name: str, data: bytes) -> dict:
        e = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), "size": len(data),
             "path": name}
        if self._lfs(name):
            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return e

    def _send_json(self, h, obj, head=False, status=200):
        body = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlsplit(h.path)
        path = unquote(url.path)
        self.requests.append((h.command, path))
        if h.headers.get("Authorization"):
            self.auth.append(h.headers["Authorization"])
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/(tree|revision|refs)(?:/([^/]+))?(?:/(.*))?)?$", path)
        if m:
            repo, kind, rev = m.group(1), m.group(2), m.group(3)
            files = self.repos.get(repo)
            if files is None:
                return self._send_json(h, {"error": "Repository not found"}, head, 404)
            if kind == "tree":
                return self._send_json(h, [self._entry(n, d) for n, d in files.items()], head)
            if kind == "refs":
                return self._send_json(h, {"branches": [{"name": "main", "ref": "refs/heads/main",
                                                         "targetCommit": self.commit}], "tags": [], "converts": []},
                                       head)
            return self._send_json(h, {"id": repo, "modelId": repo, "sha": self.commit, "private": False,
                                       "siblings": [{"rfilename": n} for n in files]}, head)
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m and m.group(1) in self.repos and m.group(3) in self.repos[m.group(1)]:
            name, data = m.group(3), self.repos[m.group(1)][m.group(3)]
            etag = '"' + (hashlib.sha256(data).hexdigest() if self._lfs(name) else self._entry(name, data)["oid"]) + '"'
            start, end = 0, len(data) - 1
            rng = h.headers.get("Range")
            status = 200
            if rng and (r := re.match(r"bytes=(\d+)-(\d*)", rng)):
                start, end, status = int(r.group(1)), int(r.group(2) or end), 206
            h.send_response(status)
            h.send_header("X-Repo-Commit", self.commit)
            h.send_header("ETag", etag)
            if self._lfs(name):
                h.send_header("X-Linked-Etag", etag)
                h.send_header("X-Linked-Size", str(len(data)))
            h.send_header("Content-Length", str(end - start + 1))
            h.send_header("Accept-Ranges", "bytes")
            if status == 206:
                h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            h.send_header("Content-Type", "application/octet-stream")
            h.end_headers()
            if not head:
                h.wfile.write(data[start:end + 1])
            return
        h.send_response(404)
        h.send_header("X-Error-Code", "EntryNotFound")
        h.send_header("Content-Length", "0")
        h.end_headers()

"""A dataset Hub on 127.0.0.1 as huggingface_hub's `HfFileSystem` reads it (never the network).

It answers the endpoints `hf://datasets/ORG/NAME/...` reads go through: `GET /api/datasets/{repo}/revision/{rev}`
(the repo and its commit), `GET /api/datasets/{repo}/tree/{rev}[/{path}]` (a folder's listing, `recursive`),
`POST /api/datasets/{repo}/paths-info/{rev}` (one path's entry: size, blob id) and `GET`/`HEAD
/datasets/{repo}/resolve/{rev}/{path}` with `Range` (the bytes, 206 for a range). Repos are folders of bytes in
memory; every request is logged.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

SHA = "89abcdef0123456789abcdef0123456789abcdef"


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


class DatasetHub:
    """Dataset repos (`org/name` -> {path: bytes}) served as the Hub serves them."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def do_POST(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def entry(self, path: str, data: bytes | None) -> dict[str, object]:
        if data is None:
            return {"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest()}
        return {"type": "file", "path": path, "size": len(data), "oid": _blob_id(data)}

    def listing(self, files: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, object]]:
        prefix = f"{folder}/" if folder else ""
        out: dict[str, dict[str, object]] = {}
        for name, data in sorted(files.items()):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                sub = prefix + "/".join(rest[:depth])
                if recursive or depth == 1:
                    out.setdefault(sub, self.entry(sub, None))
                if not recursive:
                    break
            if recursive or len(rest) == 1:
                out[name] = self.entry(name, data)
        return list(out.values())

    def answer(self, req: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append(f"{req.command} {req.path}")
        url = urlparse(req.path)
        path = unquote(url.path)
        if re.match(r"^/api/datasets/[^/]+/[^/]+$", path):  # the repo's info without a revision: main's
            path = f"{path}/revision/main"
        m = re.match(r"^/api/datasets/([^/]+/[^/]+)/(revision|tree|paths-info)/([^/]+)(?:/(.*))?$", path)
        if m:
            repo, kind, rev, rest = m.group(1), m.group(2), m.group(3), (m.group(4) or "").strip("/")
            files = self.repos.get(repo)
            if files is None:
                return self.send(req, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)
            if rev not in ("main", SHA):
                return self.send(req, 404, b"{}", {"X-Error-Code": "RevisionNotFound"}, body)
            if kind == "revision":
                info = {"id": repo, "sha": SHA, "private": False, "siblings": [{"rfilename": p} for p in files]}
                return self.json(req, info, body)
            if kind == "tree":
                recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
                if rest and rest in files:
                    return self.send(req, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)
                return self.json(req, self.listing(files, rest, recursive), body)
            length = int(req.headers.get("Content-Length") or 0)
            form = parse_qs(req.rfile.read(length).decode()) if length else {}
            asked = form.get("paths", [])
            found = []
            for p in asked:
                if p in files:
                    found.append(self.entry(p, files[p]))
                elif any(f.startswith(p.rstrip("/") + "/") for f in files):
                    found.append(self.entry(p, None))
            return self.json(req, found, body)
        m = re.match(r"^/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            repo, rev, name = m.group(1), m.group(2), m.group(3)
            files = self.repos.get(repo)
            if files is None or rev not in ("main", SHA):
                return self.send(req, 404, b"", {"X-Error-Code": "RepoNotFound"}, body)
            if name not in files:
                return self.send(req, 404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": SHA}, body)
            data = files[name]
            headers = {"X-Repo-Commit": SHA, "ETag": f'"{_blob_id(data)}"', "Accept-Ranges": "bytes"}
            rng = re.match(r"bytes=(\d+)-(\d*)$", req.headers.get("Range") or req.headers.get("range") or "")
            if rng:
                start = int(rng.group(1))
                end = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
                if start >= len(data):
                    return self.send(req, 416, b"", headers, body)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                return self.send(req, 206, data[start : end + 1], headers, body)
            return self.send(req, 200, data, headers, body)
        return self.send(req, 404, b"", {}, body)

    def json(self, req: BaseHTTPRequestHandler, value: object, body: bool) -> None:
        self.send(req, 200, json.dumps(value).encode(), {"Content-Type": "application/json"}, body)

    @staticmethod
    def send(req: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        req.send_response(status)
        for k, v in headers.items():
            req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if body:
            req.wfile.write(data)


@contextmanager
def serving(repos: dict[str, dict[str, bytes]]) -> Iterator[DatasetHub]:
    """A DatasetHub serving in a thread for the duration of the block."""
    hub = DatasetHub(repos)
    thread = threading.Thread(target=hub.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.server.shutdown()
        hub.server.server_close()

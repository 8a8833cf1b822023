"""A local HTTP server that speaks the Hugging Face Hub's file-resolve protocol.

The real `huggingface_hub` client talks to it through `HF_ENDPOINT`: `HEAD/GET
/{repo}/resolve/{revision}/{path}` answers like the hub for LFS files (a redirect to a
content URL with `X-Repo-Commit`, `X-Linked-Etag` = sha256 and `X-Linked-Size`), errors
carry the hub's `X-Error-Code`, and content URLs honour `Range`. The model search
(`GET /api/models?search=&filter=&sort=&limit=`, what `HfApi.list_models` calls: a
case-insensitive substring of the repo id, ordered by
downloads) and the file listing (`GET /api/models/{repo}/tree/{revision}`, what
`HfApi.list_repo_tree` calls) answer too. Knobs for tests: gated
repos, a throttle, a one-off dropped connection, a lying etag or size. Every request is
logged with its Range header and the bytes sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

GOOD_TOKEN = "hf_test_token"


@dataclass
class HubFile:
    path: Path
    sha256: str
    etag: str  # what the hub advertises (normally the sha256)
    size: int  # what the hub advertises (normally the file size)


@dataclass
class Repo:
    commit: str
    files: dict[str, HubFile] = field(default_factory=dict)
    gated: bool = False
    downloads: int = 0
    tags: tuple[str, ...] = ("gguf",)


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    sent: int


class Hub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.log: list[Logged] = []
        self.throttle: float | None = None  # bytes per second on content URLs
        self.drop_after: int | None = None  # close the next content response after N bytes
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def cdn(self) -> str:
        """Content lives on another host name, as on the hub (so the client does not follow
        the redirect on HEAD, and drops the token on GET)."""
        return f"http://localhost:{self._server.server_address[1]}/cdn"

    def add(
        self,
        repo: str,
        filename: str,
        path: Path,
        *,
        gated: bool = False,
        etag: str | None = None,
        size: int | None = None,
        downloads: int | None = None,
    ) -> HubFile:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        commit = hashlib.sha1(repo.encode()).hexdigest()
        entry = self.repos.setdefault(repo, Repo(commit))
        entry.gated = entry.gated or gated
        if downloads is not None:
            entry.downloads = downloads
        f = HubFile(path, digest, etag or digest, size or path.stat().st_size)
        entry.files[filename] = f
        return f

    def content_gets(self) -> list[Logged]:
        return [e for e in self.log if e.method == "GET" and e.path.startswith("/cdn/")]

    def __enter__(self) -> Hub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)/?$")


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", "0")
            self.end_headers()
            hub.log.append(Logged(self.command, self.path, self.headers.get("Range"), 0))

        def _json(self, data: object, body: bool) -> None:
            raw = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if body:
                self.wfile.write(raw)
            hub.log.append(Logged(self.command, self.path, None, len(raw)))

        def _search(self, body: bool) -> None:
            query = parse_qs(urlsplit(self.path).query)
            term = (query.get("search") or [""])[0].lower()
            wanted = set(query.get("filter") or ())
            found = [
                (name, repo)
                for name, repo in hub.repos.items()
                if term in name.lower() and wanted <= set(repo.tags)
            ]
            if (query.get("sort") or [""])[0] == "downloads":
                found.sort(key=lambda item: -item[1].downloads)
            limit = int((query.get("limit") or ["1000"])[0])
            models = [
                {
                    "id": name,
                    "_id": repo.commit[:24],
                    "modelId": name,
                    "downloads": repo.downloads,
                    "tags": list(repo.tags),
                    "private": False,
                    "gated": repo.gated and "auto",
                }
                for name, repo in found[:limit]
            ]
            self._json(models, body)

        def _tree(self, m: re.Match, body: bool) -> None:
            repo = hub.repos.get(m["repo"])
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository Not Found")
            if m["rev"] not in ("main", repo.commit):
                return self._error(404, "RevisionNotFound", "Invalid rev id")
            listing = [
                {
                    "type": "file",
                    "oid": hashlib.sha1(f.sha256.encode()).hexdigest(),
                    "size": f.size,
                    "path": name,
                    "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134},
                }
                for name, f in sorted(repo.files.items())
            ]
            self._json(listing, body)

        def _route(self, body: bool) -> None:
            plain = self.path.split("?")[0]
            if plain == "/api/models":
                return self._search(body)
            tree = _TREE.match(plain)
            if tree:
                return self._tree(tree, body)
            if self.path.startswith("/cdn/"):
                return self._content(self.path.removeprefix("/cdn/"), body)
            m = _RESOLVE.match(self.path.split("?")[0])
            if not m:
                return self._error(404, "RepoNotFound", "Not a resolve URL")
            repo = hub.repos.get(m["repo"])
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository Not Found")
            if repo.gated and self.headers.get("Authorization") != f"Bearer {GOOD_TOKEN}":
                return self._error(
                    401,
                    "GatedRepo",
                    "Access to this model is restricted. You must be authenticated.",
                )
            if m["rev"] not in ("main", repo.commit):
                return self._error(404, "RevisionNotFound", "Invalid rev id")
            f = repo.files.get(m["file"])
            if f is None:
                return self._error(404, "EntryNotFound", "Entry not found", repo.commit)
            self.send_response(302)
            self.send_header("Location", f"{hub.cdn}/{m['repo']}/{m['file']}")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{f.etag}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("ETag", f'"{f.etag}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            hub.log.append(Logged(self.command, self.path, self.headers.get("Range"), 0))

        def _content(self, key: str, body: bool) -> None:
            repo_name = "/".join(key.split("/")[:2])
            filename = "/".join(key.split("/")[2:])
            f = hub.repos[repo_name].files[filename]
            data = f.path.read_bytes()
            start, end = 0, len(data) - 1
            rng = self.headers.get("Range")
            if rng:
                a, _, b = rng.removeprefix("bytes=").partition("-")
                start = int(a)
                end = min(int(b), len(data) - 1) if b else len(data) - 1
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            sent = 0
            entry = Logged(self.command, self.path, rng, 0)
            hub.log.append(entry)
            if not body:
                return
            drop, hub.drop_after = hub.drop_after, None
            chunk = 1 << 16
            pos = start
            try:
                while pos <= end:
                    piece = data[pos : min(pos + chunk, end + 1)]
                    if drop is not None and sent + len(piece) > drop:
                        self.wfile.write(piece[: max(drop - sent, 0)])
                        self.wfile.flush()
                        entry.sent = drop
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self.wfile.write(piece)
                    sent += len(piece)
                    entry.sent = sent
                    pos += len(piece)
                    if hub.throttle:
                        time.sleep(len(piece) / hub.throttle)
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler

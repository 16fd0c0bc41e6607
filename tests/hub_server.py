"""A loopback server that speaks the parts of the Hugging Face Hub's HTTP protocol that
huggingface_hub's downloads use, with fault injection. Selected with ``HF_ENDPOINT``.

Routes (model repositories only):

* ``GET /api/models/{repo}/revision/{rev}``: revision info, ``sha`` is the commit.
* ``GET /api/models/{repo}/tree/{rev}?recursive=...``: the file tree, paginated with a
  GitHub-style ``Link: <...>; rel="next"`` header. LFS entries carry ``lfs.oid`` (sha256).
* ``HEAD|GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (the git blob
  sha1), ``X-Linked-Etag`` and ``X-Linked-Size`` for LFS files, ``Accept-Ranges`` and
  ``Range`` requests (206 with ``Content-Range``).

Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) as the Hub
does; with a ``token`` set, a request without ``Authorization: Bearer <token>`` gets 401.

Faults, per file path, each consumed by one GET of that file (see :meth:`HubServer.fault`):
``drop`` (half the body, then a connection reset), ``truncate`` (half the body, then a
clean close), ``error`` (a 503 answer), ``corrupt`` (the right length with one byte
flipped; persistent until cleared), and ``rate`` (bytes per second for every GET, a slow
server). ``hold`` makes GETs of a file stop after half its body until released.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

#: Files stored as LFS objects (sha256 oid, X-Linked-* headers), as the Hub does for weights.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]

    def entry(self, path: str) -> dict:
        data = self.files[path]
        out = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
        if path.endswith(LFS_SUFFIXES):
            out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out


@dataclass
class Repo:
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        sha = self.refs.get(revision, revision)
        return self.commits.get(sha)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int = 0


class HubServer:
    """The loopback Hub; ``with HubServer() as hub: hub.add_commit(...)``; ``hub.endpoint``."""

    def __init__(self, *, token: str | None = None, page_size: int = 50) -> None:
        self.repos: dict[str, Repo] = defaultdict(Repo)
        self.token = token
        self.page_size = page_size
        self.requests: list[Request] = []
        self.faults: dict[str, list[str]] = defaultdict(list)
        self.corrupt: set[str] = set()
        self.rate: float | None = None
        self.held: dict[str, threading.Event] = {}
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- content
    def add_commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main",
                   tags: tuple[str, ...] = ()) -> str:
        """Add a commit holding ``files`` and point ``branch`` (and ``tags``) at it; returns its sha."""
        digest = hashlib.sha1()
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + hashlib.sha1(files[path]).digest())
        digest.update(repo_id.encode() + str(len(self.repos[repo_id].commits)).encode())
        sha = digest.hexdigest()
        repo = self.repos[repo_id]
        repo.commits[sha] = Commit(sha, dict(files))
        for ref in (branch, *tags):
            repo.refs[ref] = sha
        return sha

    def fault(self, path: str, *kinds: str) -> None:
        """Queue faults for the next GETs of ``path`` (one per GET, in order)."""
        with self.lock:
            for kind in kinds:
                if kind == "corrupt":
                    self.corrupt.add(path)
                else:
                    self.faults[path].append(kind)

    def hold(self, path: str) -> threading.Event:
        """GETs of ``path`` stop after half the body until the returned event is set."""
        event = threading.Event()
        self.held[path] = event
        return event

    def gets(self, path_suffix: str = "") -> list[Request]:
        """GET requests of resolve URLs ending with ``path_suffix``."""
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path
                and r.path.endswith(path_suffix)]

    def body_bytes(self) -> int:
        return sum(r.body_bytes for r in self.gets())

    # -- lifecycle
    @property
    def endpoint(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, port: int = 0) -> HubServer:
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="loopback-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        for event in self.held.values():
            event.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self.lock:  # kept-alive connections too: a stopped Hub answers nothing
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self.connections.clear()

    def __enter__(self) -> HubServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?$")
_REVISION = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)/revision/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+|[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub.lock:
            self.hub.connections.add(self.connection)

    def finish(self) -> None:
        with self.hub.lock:
            self.hub.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    # -- helpers
    def _log(self, status: int, body_bytes: int = 0) -> None:
        with self.hub.lock:
            self.hub.requests.append(Request(self.command, urlsplit(self.path).path, self.headers.get("Range"),
                                             status, body_bytes))

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._log(status, len(body) if self.command != "HEAD" else 0)

    def _json(self, value: object, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self) -> bool:
        if self.hub.token is None or self.headers.get("Authorization") == f"Bearer {self.hub.token}":
            return True
        self._error(401, "RepoNotFound", "Invalid credentials in Authorization header")
        return False

    def _commit(self, repo_id: str, revision: str) -> Commit | None:
        if repo_id not in self.hub.repos:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        commit = self.hub.repos[repo_id].resolve(unquote(revision))
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(revision)}")
        return commit

    # -- routes
    def do_HEAD(self) -> None:  # noqa: N802 - stdlib name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlsplit(self.path)
        path = url.path
        if not self._authorized():
            return
        if m := _REVISION.match(path):
            commit = self._commit(m["repo"], m["rev"])
            if commit is not None:
                self._json({"id": m["repo"], "modelId": m["repo"], "sha": commit.sha, "private": False,
                            "siblings": [{"rfilename": p} for p in sorted(commit.files)]})
        elif m := _TREE.match(path):
            self._tree(m["repo"], m["rev"], m["sub"] or "", parse_qs(url.query))
        elif m := _RESOLVE.match(path):
            self._resolve(m["repo"], m["rev"], unquote(m["file"]))
        else:
            self._error(404, "NotFound", f"no route for {path}")

    def _tree(self, repo_id: str, revision: str, sub: str, query: dict[str, list[str]]) -> None:
        commit = self._commit(repo_id, revision)
        if commit is None:
            return
        prefix = sub.strip("/") + "/" if sub.strip("/") else ""
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        entries: list[dict] = []
        folders: set[str] = set()
        for p in sorted(commit.files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/", 1)[0])
                continue
            if recursive:
                parts = rest.split("/")[:-1]
                folders.update(prefix + "/".join(parts[:i + 1]) for i in range(len(parts)))
            entries.append(commit.entry(p))
        entries += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0}
                    for f in sorted(folders)]
        cursor = int(query.get("cursor", ["0"])[0])
        page = entries[cursor:cursor + self.hub.page_size]
        headers = {}
        if cursor + self.hub.page_size < len(entries):
            nxt = f"{self.hub.endpoint}{urlsplit(self.path).path}?recursive={str(recursive).lower()}" \
                  f"&cursor={cursor + self.hub.page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._json(page, headers)

    def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
        commit = self._commit(repo_id, revision)
        if commit is None:
            return
        if filename not in commit.files:
            self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit.sha,
                                  "X-Error-Message": f"{filename} does not exist"})
            return
        data = commit.files[filename]
        entry = commit.entry(filename)
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if "lfs" in entry:
            headers.update({"X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Size": str(len(data))})
        if self.command == "HEAD":
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            self._log(200)
            return
        with self.hub.lock:
            queued = self.hub.faults.get(filename)
            fault = queued.pop(0) if queued else None
            corrupt = filename in self.hub.corrupt
        if fault == "error":
            self._error(503, "ServiceUnavailable", "loopback hub: injected 503")
            return
        if corrupt and data:
            data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
        start, end, status = 0, len(data) - 1, 200
        if m := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
            start = int(m[1])
            end = min(int(m[2]) if m[2] else len(data) - 1, len(data) - 1)
            if start >= len(data):
                self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        body = data[start:end + 1]
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        limit = len(body) // 2 if fault in ("drop", "truncate") or filename in self.hub.held else len(body)
        sent = self._stream(body[:limit])
        self._log(status, sent)
        if filename in self.hub.held and sent == limit:
            self.hub.held[filename].wait(timeout=120)
        if limit < len(body):
            if fault == "drop":  # reset: SO_LINGER 0 then close sends RST
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

    def _stream(self, body: bytes) -> int:
        sent, chunk = 0, 64 * 1024
        started = time.monotonic()
        try:
            while sent < len(body):
                piece = body[sent:sent + chunk]
                self.wfile.write(piece)
                sent += len(piece)
                if self.hub.rate:
                    ahead = sent / self.hub.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return sent


def model_files(seed: int = 0, *, shards: int = 2, shard_bytes: int = 1 << 20) -> dict[str, bytes]:
    """The files of a small repository: a config, a tokenizer file and ``shards`` weight
    shards of pseudo-random bytes (distinct per seed), like a sharded safetensors model."""
    import random

    rng = random.Random(seed)
    files = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                   "hidden_size": 256, "num_hidden_layers": 4}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "seed": seed}).encode(),
        "README.md": b"# loopback test model\n",
    }
    for i in range(shards):
        files[f"model-{i + 1:05d}-of-{shards:05d}.safetensors"] = rng.randbytes(shard_bytes)
    return files


__all__ = ["HubServer", "model_files", "git_blob_sha1"]

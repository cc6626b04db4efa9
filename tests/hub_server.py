"""A Hugging Face hub on 127.0.0.1, written for the tests: serves folders as model and
dataset repositories to the pinned ``huggingface_hub``, ``transformers``, ``datasets`` and
``lm-eval``, which reach it through ``HF_ENDPOINT`` as a hub user's run reaches the hub.

Why not a packaged server: olah 0.5.4 (the self-hosted mirror, which serves local git
repositories with ``offline = true``) answers a file absent from such a repository at a
branch (``/resolve/main/adapter_config.json``) with 401 ``RepoNotFound`` instead of 404
``EntryNotFound``: offline it looks the branch up upstream and finds nothing. transformers
probes optional files (``adapter_config.json``) and ``datasets`` probes ``README.md``, so
every model load failed with "not a valid model identifier". It would also have pulled
fastapi, uvicorn, GitPython and peewee into the pinned environment.

What it speaks (the requests the pinned clients make, read from their source): ``HEAD`` /
``GET`` ``[/datasets]/<repo>/resolve/<rev>/<path>`` with ``ETag`` (the git blob sha1, or the
sha256 of a large-file-storage file, also as ``X-Linked-Etag`` / ``X-Linked-Size``),
``X-Repo-Commit``, ``Content-Length`` and byte ranges (``datasets`` streaming reads ranges);
``GET /api/<models|datasets>/<repo>[/revision/<rev>]`` (the repository info and its files),
``GET /api/<type>/<repo>/tree/<rev>[/<path>]``, ``POST /api/<type>/<repo>/paths-info/<rev>``,
and ``GET /api/agent-harnesses`` (an empty registry). Errors carry the hub's ``X-Error-Code``:
an unknown repository is 401 ``RepoNotFound``, a missing file 404 ``EntryNotFound``, an
unknown revision 404 ``RevisionNotFound``. Every request is recorded (:attr:`HubServer.log`),
an unanswered route as ``"unknown"``.

A repository's hashes are taken when it is added (:meth:`HubServer.add`); its files are read
when served, so a file changed afterwards is served with the hashes of the original: what a
tampered mirror or a corrupted transfer looks like to a client.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

#: file endings stored as large files (git LFS) on the hub: their ETag is the sha256
LFS_SUFFIXES = (".safetensors", ".bin", ".parquet", ".arrow", ".gguf", ".pt", ".pth")
#: the date every served repository reports (fixed: nothing depends on it)
DATE = "2025-01-01T00:00:00.000Z"


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's bytes (what the hub's ETag is for a small file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One file of a repository, as recorded when it was added."""

    path: str
    size: int
    oid: str  # git blob sha1
    sha256: str | None  # for a large file only

    @property
    def etag(self) -> str:
        return self.sha256 or self.oid

    def tree(self) -> dict:
        out: dict = {"type": "file", "oid": self.oid, "size": self.size, "path": self.path}
        if self.sha256:
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return out


class Repo:
    """A folder served as one repository at one commit (branch ``main``)."""

    def __init__(self, repo_type: str, repo_id: str, folder: Path) -> None:
        self.repo_type, self.repo_id, self.folder = repo_type, repo_id, folder
        self.entries: dict[str, Entry] = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data, rel = path.read_bytes(), path.relative_to(folder).as_posix()
            lfs = rel.endswith(LFS_SUFFIXES)
            self.entries[rel] = Entry(rel, len(data), git_blob_sha1(data),
                                      hashlib.sha256(data).hexdigest() if lfs else None)
        listing = json.dumps([(e.path, e.oid) for e in self.entries.values()]).encode()
        self.sha = hashlib.sha1(repo_id.encode() + listing).hexdigest()

    def revision_ok(self, rev: str) -> bool:
        return rev in ("main", self.sha)

    def folders(self) -> set[str]:
        return {"/".join(p.split("/")[:i]) for p in self.entries
                for i in range(1, p.count("/") + 1)}

    def info(self) -> dict:
        out = {"_id": self.sha[:24], "id": self.repo_id, "author": self.repo_id.split("/")[0],
               "sha": self.sha, "lastModified": DATE, "createdAt": DATE, "private": False,
               "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
               "siblings": [{"rfilename": p} for p in self.entries]}
        if self.repo_type == "model":
            out["modelId"] = self.repo_id
        return out

    def tree(self, path: str, recursive: bool) -> list[dict] | None:
        prefix = f"{path}/" if path else ""
        if path and path not in self.folders():
            return None
        out = []
        for folder in sorted(self.folders()):
            rest = folder[len(prefix):]
            if folder.startswith(prefix) and rest and (recursive or "/" not in rest):
                out.append({"type": "directory", "oid": "0" * 40, "path": folder})
        for entry in self.entries.values():
            rest = entry.path[len(prefix):]
            if entry.path.startswith(prefix) and (recursive or "/" not in rest):
                out.append(entry.tree())
        return out

    def paths_info(self, paths: list[str]) -> list[dict]:
        folders = self.folders()
        return [self.entries[p].tree() if p in self.entries
                else {"type": "directory", "oid": "0" * 40, "path": p}
                for p in paths if p in self.entries or p in folders]


class HubServer:
    """The hub on ``127.0.0.1:<free port>``, serving in a thread until :meth:`stop` (or the
    end of a ``with`` block). ``endpoint`` is what ``HF_ENDPOINT`` must be."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.log: list[tuple[str, str, int]] = []  # (method, path, status)
        self.unknown: list[str] = []  # requests no route of this hub answers
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True)

    def add(self, repo_type: str, repo_id: str, folder: str | Path) -> Repo:
        """Serve ``folder`` as repository ``repo_id`` (``repo_type`` ``model`` or
        ``dataset``), hashed now."""
        repo = Repo(repo_type, repo_id, Path(folder))
        self.repos[(repo_type, repo_id)] = repo
        return repo

    def fetched(self, method: str = "GET") -> list[str]:
        """The paths of the requests made with ``method`` that were answered 2xx."""
        with self._lock:
            return [p for m, p, s in self.log if m == method and 200 <= s < 300]

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # the hub's log is HubServer.log
            pass

        def do_HEAD(self) -> None:  # noqa: N802  (http.server's names)
            self._route("HEAD")

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            path, query = unquote(url.path), parse_qs(url.query)
            body = b""
            if method == "POST":
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = path.strip("/").split("/")
            if path == "/api/agent-harnesses":
                status = self._json({"standardEnvVars": [], "harnesses": {}})
            elif parts[0] == "api" and len(parts) >= 4 and parts[1] in ("models", "datasets"):
                status = self._api(method, parts[1][:-1], "/".join(parts[2:4]), parts[4:],
                                   query, body)
            elif "resolve" in parts[2:4]:
                kind = "dataset" if parts[0] == "datasets" else "model"
                at = parts.index("resolve")
                status = self._resolve(method, kind, "/".join(parts[at - 2:at]),
                                       parts[at + 1], "/".join(parts[at + 2:]))
            else:
                status = self._error(404, "unknown", "no such route")
            with hub._lock:
                hub.log.append((method, path, status))

        def _repo(self, kind: str, repo_id: str) -> Repo | None:
            return hub.repos.get((kind, repo_id))

        def _api(self, method: str, kind: str, repo_id: str, rest: list[str],
                 query: dict, body: bytes) -> int:
            repo = self._repo(kind, repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            rev = unquote(rest[1]) if len(rest) > 1 else "main"
            if rest and not repo.revision_ok(rev):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if not rest or rest[0] == "revision":
                return self._json(repo.info())
            if rest[0] == "tree":
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                listing = repo.tree("/".join(rest[2:]), recursive)
                if listing is None:
                    return self._error(404, "EntryNotFound", "no such folder")
                return self._json(listing)
            if rest[0] == "paths-info" and method == "POST":
                form = parse_qs(body.decode())
                paths = form.get("paths") or json.loads(body or b"{}").get("paths", [])
                return self._json(repo.paths_info(paths))
            return self._error(404, "unknown", "no such route")

        def _resolve(self, method: str, kind: str, repo_id: str, rev: str, path: str) -> int:
            repo = self._repo(kind, repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if not repo.revision_ok(rev):
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            entry = repo.entries.get(path)
            if entry is None:
                return self._error(404, "EntryNotFound", "Entry not found", repo.sha)
            data = (repo.folder / path).read_bytes()  # as it is now: maybe not as recorded
            start, end = 0, len(data) - 1
            status = 200
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes="):
                first, _, last = wanted[6:].split(",")[0].partition("-")
                start = int(first) if first else max(0, len(data) - int(last))
                end = min(int(last), len(data) - 1) if first and last else len(data) - 1
                if start >= len(data):
                    return self._error(416, "RangeNotSatisfiable", "range", repo.sha)
                status = 206
            chunk = data[start:end + 1]
            self.send_response(status)
            self.send_header("ETag", f'"{entry.etag}"')
            self.send_header("X-Repo-Commit", repo.sha)
            if entry.sha256:
                self.send_header("X-Linked-Etag", f'"{entry.sha256}"')
                self.send_header("X-Linked-Size", str(entry.size))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(chunk)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if method == "GET":
                self.wfile.write(chunk)
            return status

        def _json(self, value: object) -> int:
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return 200

        def _error(self, status: int, code: str, message: str, commit: str | None = None) -> int:
            if code == "unknown":
                hub.unknown.append(f"{self.command} {self.path}")
            data = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return status

    return Handler

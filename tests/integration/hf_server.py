"""A local stand-in for the Hugging Face Hub: serves one folder as a model repository.

It answers the requests that `hf download` (huggingface_hub 2.x `snapshot_download`) makes, read in
huggingface_hub's `hf_api.py` (`repo_info`, `list_repo_tree`) and `file_download.py` (`get_hf_file_metadata`,
`http_get`):
  GET  /api/models/{repo}/revision/{rev}          -> {"id", "sha", "siblings": [{"rfilename"}]}
  GET  /api/models/{repo}/tree/{rev}?recursive=.. -> [{"type": "file", "path", "size", "oid"}] (one page)
  HEAD /{repo}/resolve/{rev}/{file}               -> ETag, X-Repo-Commit, Content-Length (no body)
  GET  /{repo}/resolve/{rev}/{file}               -> the bytes; honours "Range: bytes=N-" (resume)
The client requires X-Repo-Commit and an ETag on HEAD (it names the blob after the ETag); Content-Length
is the expected size it checks the finished file against. No Xet headers, so the plain HTTP path runs.
`interrupt_next(file)` makes the next GET of that file stop halfway and drop the connection, as a network
failure would; the client then resumes with "Range: bytes=<received>-" (huggingface_hub's `http_get`).
Unknown repos, revisions or files answer 404 with X-Error-Code like the Hub, so the client raises its
RepositoryNotFound / RevisionNotFound / EntryNotFound errors.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    """One served repository: a folder, fixed at start, with a commit id derived from its content."""

    repo_id: str
    root: Path
    files: dict[str, Path] = field(init=False)
    blob_ids: dict[str, str] = field(init=False)
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        self.files = {p.relative_to(self.root).as_posix(): p
                      for p in sorted(self.root.rglob("*")) if p.is_file()}
        # git's blob id: sha1 over "blob <size>\0" + content, the ETag the Hub gives non-LFS files.
        self.blob_ids = {name: _git_blob_id(path.read_bytes()) for name, path in self.files.items()}
        digest = hashlib.sha1(json.dumps(self.blob_ids, sort_keys=True).encode())
        self.commit = digest.hexdigest()

    def knows(self, revision: str) -> bool:
        return revision in ("main", self.commit)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_API_REVISION = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_API_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<path>/.*)?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-(?P<end>\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: object) -> None:
        self.server.log.append(f"{self.command} {self.path}")

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        for pattern, handler in ((_API_REVISION, self._revision), (_API_TREE, self._tree),
                                 (_RESOLVE, self._resolve)):
            match = pattern.match(path)
            if match:
                handler(match, body)
                return
        self._error(404, "EntryNotFound", f"no route for {path}")

    def _repo(self, match: re.Match[str]) -> Repo | None:
        repo = self.server.repos.get(match["repo"])
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {match['repo']} not found")
            return None
        if not repo.knows(match["rev"]):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {match['rev']}", repo.commit)
            return None
        return repo

    def _revision(self, match: re.Match[str], body: bool) -> None:
        repo = self._repo(match)
        if repo:
            self._json({"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit, "private": False,
                        "siblings": [{"rfilename": name} for name in repo.files]}, body)

    def _tree(self, match: re.Match[str], body: bool) -> None:
        repo = self._repo(match)
        if repo:
            self._json([{"type": "file", "path": name, "size": path.stat().st_size, "oid": repo.blob_ids[name]}
                        for name, path in repo.files.items()], body)

    def _resolve(self, match: re.Match[str], body: bool) -> None:
        repo = self._repo(match)
        if repo is None:
            return
        path = repo.files.get(match["file"])
        if path is None:
            self._error(404, "EntryNotFound", f"{match['file']} does not exist", repo.commit)
            return
        data = path.read_bytes()
        start, status = 0, 200
        wanted = _RANGE.match(self.headers.get("Range", ""))
        if wanted and body:
            start, status = int(wanted["start"]), 206
            self.server.ranges.append((match["file"], start))
        self.send_response(status)
        self.send_header("ETag", f'"{repo.blob_ids[match["file"]]}"')
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if not body:
            return
        if match["file"] in self.server.interrupt:
            self.server.interrupt.discard(match["file"])
            self.wfile.write(data[start:start + (len(data) - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:])
        self.server.downloads.append(match["file"])

    def _json(self, payload: object, body: bool) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], repos: dict[str, Repo]) -> None:
        super().__init__(address, _Handler)
        self.repos = repos
        self.log: list[str] = []
        self.downloads: list[str] = []
        self.ranges: list[tuple[str, int]] = []
        self.interrupt: set[str] = set()


class HubServer:
    """`with HubServer({"org/name": folder}) as hub:` serves the folders at hub.port on all interfaces."""

    def __init__(self, repos: dict[str, Path], host: str = "0.0.0.0", port: int = 0) -> None:
        self.repos = {repo_id: Repo(repo_id, Path(root)) for repo_id, root in repos.items()}
        self._server = _Server((host, port), self.repos)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def downloads(self) -> list[str]:
        """Files whose bytes were sent (GET), in order."""
        return self._server.downloads

    @property
    def ranges(self) -> list[tuple[str, int]]:
        """(file, first byte) of each GET that asked for a range: a client resuming a partial file."""
        return self._server.ranges

    def interrupt_next(self, file: str) -> None:
        """Send only the first half of the next GET of `file`, then drop the connection."""
        self._server.interrupt.add(file)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


if __name__ == "__main__":  # manual use: python hf_server.py org/name FOLDER [PORT]
    import sys

    with HubServer({sys.argv[1]: Path(sys.argv[2])}, port=int(sys.argv[3]) if len(sys.argv) > 3 else 8765) as hub:
        print(f"serving {sys.argv[1]} at commit {hub.repos[sys.argv[1]].commit} on :{hub.port}", flush=True)
        threading.Event().wait()

"""A local stand-in for the Hugging Face Hub, for the hub-tier tests: an HTTP server on 127.0.0.1.

It serves the recorded API answers and repository files of `tests/fixtures/hub_server/` in the Hub's URL
layout:

- `GET /api/models?...` (list_models) and `GET /api/models/{owner}/{name}[/revision/{rev}]` (model_info),
- `HEAD|GET /{owner}/{name}/resolve/{revision}/{file}` with the headers huggingface_hub reads: `ETag` (the
  git blob id, or the sha256 for LFS files, as the Hub gives them), `X-Repo-Commit`, `Content-Length`,
  `Accept-Ranges`; a `Range: bytes=N-` request gets `206` with `Content-Range`.

`faults` make it misbehave per repository and per file: `{"status": 503}` (every time), `{"status": 429,
"retry_after": 0}`, `{"status": 404}`, `{"delay": 3.0}` (answers after the client's timeout), `{"drop_after":
N, "times": 1}` (sends N bytes of the body and closes the connection, the first `times` GETs). Every
request is logged. Requests for any other host (a client that ignores `HF_ENDPOINT` and uses the proxy the
tests point at this server) are logged in `proxied` and refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hub_server"
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")


class HubServer:
    def __init__(self, *extra_roots: Path) -> None:
        self.roots = [FIXTURES, *extra_roots]  # each with api/ and repos/, like tests/fixtures/hub_server
        self.faults: dict[tuple[str, str], dict] = {}  # (repo, "api" or file name) -> fault
        self.log: list[dict] = []
        self.proxied: list[str] = []
        self._lock = threading.Lock()
        self._served: dict[tuple[str, str], int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                server._handle(self, head=True)

            def do_GET(self) -> None:
                server._handle(self, head=False)

            def do_CONNECT(self) -> None:
                server._refuse_proxy(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------------------------------------ queries

    def requests(
        self, method: str | None = None, repo: str | None = None, kind: str | None = None
    ) -> list[dict]:
        with self._lock:
            return [
                r
                for r in self.log
                if (method is None or r["method"] == method)
                and (repo is None or r["repo"] == repo)
                and (kind is None or r["kind"] == kind)
            ]

    def clear(self) -> None:
        with self._lock:
            self.log.clear()
            self.proxied.clear()

    # ------------------------------------------------------------------------------------------ serving

    def _find(self, *parts: str) -> Path:
        """The first root holding the path (the committed fixtures first), else a path that does not exist."""
        for root in self.roots:
            if root.joinpath(*parts).exists():
                return root.joinpath(*parts)
        return self.roots[0].joinpath(*parts)

    def _refuse_proxy(self, h: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.proxied.append(f"{h.command} {h.path}")
        self._send(h, 403, b'{"error":"not the Hub"}', {"Content-Type": "application/json"}, head=False)

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        if not h.path.startswith("/"):  # an absolute URI: a proxied request for another host
            self._refuse_proxy(h)
            return
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        m_file, m_info = _RESOLVE.match(path), _INFO.match(path)
        repo = (m_file or m_info).group("repo") if (m_file or m_info) else None
        kind = m_file.group("file") if m_file else ("api" if (m_info or path == "/api/models") else "other")
        entry = {
            "method": h.command,
            "path": h.path,
            "repo": repo,
            "kind": kind,
            "range": h.headers.get("Range"),
        }
        with self._lock:
            self.log.append(entry)
        fault = self.faults.get((repo, kind)) or self.faults.get((repo, "*")) or {}
        if fault.get("delay"):
            time.sleep(fault["delay"])
        if fault.get("status"):
            headers = {"Content-Type": "application/json", "X-Request-Id": "local-test"}
            if "retry_after" in fault:
                headers["Retry-After"] = str(fault["retry_after"])
            if fault["status"] == 404:
                headers["X-Error-Code"] = "RepoNotFound" if kind == "api" else "EntryNotFound"
            body = json.dumps({"error": f"injected {fault['status']}"}).encode()
            self._send(h, fault["status"], body, headers, head)
            entry["status"] = fault["status"]
            return
        if path == "/api/models":
            body = self._find("api", "models.json").read_bytes()
            self._send(h, 200, body, {"Content-Type": "application/json"}, head)
            entry["status"] = 200
            return
        if m_info:
            f = self._find("api", f"{repo.replace('/', '--')}.json")
            if not f.exists():
                body = b'{"error":"Repository not found"}'
                self._send(
                    h, 404, body, {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head
                )
                entry["status"] = 404
                return
            info = json.loads(f.read_text())
            rev = m_info.group("rev")
            if rev not in (None, "main", info["sha"]):
                self._send(
                    h, 404, b'{"error":"Revision not found"}', {"X-Error-Code": "RevisionNotFound"}, head
                )
                entry["status"] = 404
                return
            self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
            entry["status"] = 200
            return
        if m_file:
            self._serve_file(h, repo, m_file.group("rev"), m_file.group("file"), fault, head, entry)
            return
        self._send(h, 404, b"{}", {"Content-Type": "application/json"}, head)
        entry["status"] = 404

    def _serve_file(self, h, repo: str, rev: str, name: str, fault: dict, head: bool, entry: dict) -> None:
        info_path = self._find("api", f"{repo.replace('/', '--')}.json")
        f = self._find("repos", repo, name)
        if not info_path.exists() or not f.is_file():
            self._send(h, 404, b'{"error":"Entry not found"}', {"X-Error-Code": "EntryNotFound"}, head)
            entry["status"] = 404
            return
        info = json.loads(info_path.read_text())
        if rev not in ("main", info["sha"]):
            self._send(h, 404, b'{"error":"Revision not found"}', {"X-Error-Code": "RevisionNotFound"}, head)
            entry["status"] = 404
            return
        data = f.read_bytes()
        sib = next(s for s in info["siblings"] if s["rfilename"] == name)
        etag = sib["lfs"]["sha256"] if "lfs" in sib else sib["blobId"]
        assert hashlib.sha256(data).hexdigest() == sib.get("lfs", {}).get(
            "sha256", hashlib.sha256(data).hexdigest()
        )
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{etag}"',
            "X-Repo-Commit": info["sha"],
            "Accept-Ranges": "bytes",
        }
        start = 0
        rng = h.headers.get("Range")
        status = 200
        if rng and not head:
            m = re.match(r"bytes=(\d+)-$", rng.strip())
            if m:
                start, status = int(m.group(1)), 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if not head and fault.get("drop_after") is not None:
            with self._lock:
                n = self._served.get((repo, name), 0)
                self._served[(repo, name)] = n + 1
            if n < fault.get("times", 1):
                h.send_response(status)
                for k, v in headers.items():
                    h.send_header(k, v)
                h.send_header("Content-Length", str(len(body)))
                h.send_header("Connection", "close")
                h.end_headers()
                h.wfile.write(body[: fault["drop_after"]])
                h.wfile.flush()
                h.close_connection = True
                entry["status"] = f"{status} dropped after {fault['drop_after']} bytes"
                return
        self._send(h, status, body, headers, head)
        entry["status"] = status

    @staticmethod
    def _send(h, status: int, body: bytes, headers: dict, head: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        if not head:
            h.wfile.write(body)
        h.close_connection = True

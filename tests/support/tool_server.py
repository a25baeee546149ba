"""A tenant's tool server and reward service for tests: real HTTP on loopback,
logging every request it receives (body and headers) so tests compare what the
service sent with what it reports.

Tools are served at ``/tools/<name>``:
* ``lookup``: ``{"key": K}`` -> the value of K in ``table`` (404 text when absent);
* ``echo``: the arguments back;
* ``bad_request``: always 400 with an error text (shown to the model);
* ``broken``: always 503 (retried, then the rollout is discarded);
* ``hang``: waits until ``release`` is set (a tool past its timeout);
* ``huge``: a 2 MB output (past the 1 MB limit: a 413 text for the model).

The grader is served at ``/grade``: score 1 when ``item.answer`` is in the
sample's output text, else 0; ``grader_down`` makes it answer 500.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ToolServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, table: dict[str, str] | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.table = dict(table or {})
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []  # {path, body, headers, status}
        self.grades: list[dict[str, Any]] = []
        self.release = threading.Event()
        self.grader_down = False
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> ToolServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def tool_url(self, name: str) -> str:
        return f"{self.url}/tools/{name}"

    def tool_calls(self, name: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                c for c in self.calls if name is None or c["path"] == f"/tools/{name}"
            ]


class _Handler(BaseHTTPRequestHandler):
    server: ToolServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json"):
        with self.server.lock:
            self._entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        entry = {"path": self.path, "body": body, "headers": dict(self.headers)}
        self._entry = entry
        srv = self.server
        with srv.lock:
            (srv.grades if self.path == "/grade" else srv.calls).append(entry)
        if self.path == "/grade":
            if srv.grader_down:
                return self._send(500, b'{"error": "down"}')
            text = str((body.get("sample") or {}).get("output_text", ""))
            answer = str((body.get("item") or {}).get("answer", ""))
            score = 1.0 if answer and answer in text else 0.0
            return self._send(200, json.dumps({"score": score}).encode())
        name = self.path.removeprefix("/tools/")
        call_id = body.get("call_id")
        try:
            args = json.loads(body.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = {}
        if name == "lookup":
            key = str(args.get("key", "")) if isinstance(args, dict) else ""
            if key not in srv.table:
                return self._send(404, f"no entry for {key!r}".encode(), "text/plain")
            output = srv.table[key]
        elif name == "echo":
            output = json.dumps(args)
        elif name == "bad_request":
            return self._send(400, b"bad arguments: key is required", "text/plain")
        elif name == "broken":
            return self._send(503, b"upstream down", "text/plain")
        elif name == "hang":
            srv.release.wait()
            output = "late"
        elif name == "huge":
            output = "x" * (2 * 1024 * 1024)
        else:
            return self._send(404, b"no such tool", "text/plain")
        reply = {"type": "function_call_output", "call_id": call_id, "output": output}
        self._send(200, json.dumps(reply).encode())

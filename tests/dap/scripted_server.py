"""An HTTP server on loopback that answers each request with the next
answer a test gives it, standing for a DAP aggregator that may answer
anything: what veil's DAP client and collector parse from the network is
tried with hostile answers against a real socket and HTTP stack."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class ScriptedServer:
    """An HTTP server answering each request with the next of `answers`
    (404 once they run out), recording what it was sent. An answer may be
    a function of the request's body (to name what the request holds)."""

    def __init__(self) -> None:
        self.answers: list[Answer | Callable[[bytes], Answer]] = []
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.seen.append((self.command, self.path, headers, body))
                answer = server.answers.pop(0) if server.answers else Answer(404)
                if callable(answer):
                    answer = answer(body)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

"""Calls that send their headers and never their request, over raw HTTP/2.

Each call is a HEADERS frame (the method's path, `content-type:
application/grpc`, no credentials) without END_STREAM, and then nothing: no
DATA frame, no end of stream. To the server it is a client still sending its
request. The connections otherwise behave: the h2 package acknowledges
SETTINGS and answers PINGs, so keepalive alone does not drop them.

gRPC's own client can open such calls too (a stream-unary call whose request
iterator blocks; it stalled the synchronous server the same way), but its
channels in one process share a connection unless told otherwise, and the
honest calls of a test would then queue behind the attacker's on the
client's side. A raw client holds exactly what the test says, on
connections of its own.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions


@dataclass(frozen=True)
class Answer:
    method: str
    status: int | None  # grpc-status, None for a reset stream
    after: float  # seconds after the call was opened


@dataclass
class HeldCalls:
    """`calls` headers-only calls to `address`, the `methods` (paths such as
    "/veil.protocol.v1.Leader/UploadReports") taken in turn, spread over
    `connections` TCP connections and held until `stop()`. `answers` are the
    calls the server ended meanwhile; `closed` counts the connections it
    closed."""

    address: str
    methods: Sequence[str]
    calls: int = 200
    connections: int = 10
    opened: int = 0
    closed: int = 0
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> HeldCalls:
        """Open every call; returns once all are sent (or failed to be)."""
        ready = threading.Barrier(self.connections + 1)
        for i in range(self.connections):
            paths = [
                self.methods[n % len(self.methods)] for n in range(i, self.calls, self.connections)
            ]
            t = threading.Thread(target=self._hold, args=(paths, ready), daemon=True)
            t.start()
            self._threads.append(t)
        ready.wait(timeout=30)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def __enter__(self) -> HeldCalls:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answered(self, method: str | None = None) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if method is None or a.method == method]

    def _hold(self, paths: list[str], ready: threading.Barrier) -> None:
        host, _, port = self.address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=10)
        except OSError as e:
            self.errors.append(f"connect: {e}")
            ready.wait(timeout=30)
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        streams: dict[int, tuple[str, float]] = {}
        try:
            for path in paths:
                stream = conn.get_next_available_stream_id()
                headers = [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", path),
                    (":authority", self.address),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ]
                conn.send_headers(stream, headers, end_stream=False)
                streams[stream] = (path, time.monotonic())
            sock.sendall(conn.data_to_send())
            with self._lock:
                self.opened += len(paths)
        except OSError as e:
            self.errors.append(f"send: {e}")
        ready.wait(timeout=30)
        try:
            self._serve(sock, conn, streams)
        except (OSError, h2.exceptions.ProtocolError) as e:
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            sock.close()

    def _serve(
        self,
        sock: socket.socket,
        conn: h2.connection.H2Connection,
        streams: dict[int, tuple[str, float]],
    ) -> None:
        """Read what the server sends until stopped: record each call it ends."""
        while not self._stop.is_set():
            readable, _, _ = select.select([sock], [], [], 0.2)
            if not readable:
                continue
            data = sock.recv(65536)
            if not data:
                with self._lock:
                    self.closed += 1
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    with self._lock:
                        self.closed += 1
                    return
                status: int | None
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    found = dict(event.headers or ()).get(b"grpc-status")
                    if found is None:
                        continue  # response headers; the status comes in the trailers
                    status = int(found)
                elif isinstance(event, h2.events.StreamReset):
                    status = None
                else:
                    continue
                stream_id = event.stream_id
                if stream_id is not None and stream_id in streams:
                    path, opened = streams.pop(stream_id)
                    with self._lock:
                        self.answers.append(Answer(path, status, time.monotonic() - opened))
            out = conn.data_to_send()
            if out:
                sock.sendall(out)

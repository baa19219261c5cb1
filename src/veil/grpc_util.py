"""Channels to veil servers: TLS unless the address is on loopback."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from typing import Self

import grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 << 20
_warned_plaintext = False

# Trailing metadata of a call a veil server refused: the error's kind (its
# class, veil.aggregator.errors), whether the same request may succeed
# later ("1") or not ("0"), and, where the server advises a wait before the
# same request is sent again (an overloaded leader), that wait in whole
# milliseconds.
ERROR_KIND_KEY = "veil-error-kind"
RETRYABLE_KEY = "veil-retryable"
RETRY_AFTER_KEY = "veil-retry-after-ms"
# The longest advice a client takes from the trailer (an hour): a larger or
# malformed value is read as no advice.
MAX_RETRY_AFTER_MS = 3_600_000

# Statuses worth retrying with the same request when the server does not say
# (the call failed on the way: the server was unreachable, restarting or slow).
TRANSIENT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def _trailer(error: grpc.RpcError, key: str) -> str | None:
    trailing = getattr(error, "trailing_metadata", None)
    for k, v in (trailing() if trailing is not None else None) or ():
        if k == key and isinstance(v, str):
            return v
    return None


def error_kind(error: grpc.RpcError) -> str | None:
    """The kind of veil error the server raised, if it said."""
    return _trailer(error, ERROR_KIND_KEY)


def retry_after(error: grpc.RpcError) -> float | None:
    """The server's advice, in seconds, on when to send the same request
    again; None if it gave none (or none a client should follow)."""
    said = _trailer(error, RETRY_AFTER_KEY)
    if said is None or not said.isascii() or not said.isdigit() or len(said) > 7:
        return None
    ms = int(said)
    return ms / 1000 if ms <= MAX_RETRY_AFTER_MS else None


def is_retryable(error: grpc.RpcError) -> bool:
    """Whether the same request may succeed later: as the server says, or, for
    a call that failed before a veil server answered, by its transport status."""
    said = _trailer(error, RETRYABLE_KEY)
    if said is not None:
        return said == "1"
    return error.code() in TRANSIENT_CODES


class RpcRefused(Exception):
    """A veil server refused a call (or stayed unreachable); `code` is the
    gRPC status, `message` the server's explanation, `kind` the server's
    error kind (None if it did not say), `retryable` whether the same
    request may succeed later and `retry_after` how many seconds the server
    advised to wait before sending it again (None: no advice)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        kind: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> Self:
        code = error.code()
        return cls(
            code if code is not None else grpc.StatusCode.UNKNOWN,
            error.details() or "",
            error_kind(error),
            is_retryable(error),
            retry_after(error),
        )

    def naming_peer(self, who: str, address: str, detail: str = "") -> Self:
        """The same error, saying which server could not be reached where gRPC's
        own text ("failed to connect to all addresses") names neither the
        server nor its role; a server's own refusal is returned unchanged."""
        unreachable = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        if self.code not in unreachable or self.kind:
            return self
        return type(self)(
            self.code,
            f"the {who} at {address} cannot be reached{detail}: {self.message}",
            self.kind,
            self.retryable,
            self.retry_after,
        )


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def split_host_port(address: str) -> tuple[str, int]:
    """("127.0.0.1", 7101) from "127.0.0.1:7101", ("::1", 7101) from "[::1]:7101";
    ValueError when it is not HOST:PORT."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def bind_socket(address: str) -> socket.socket:
    """A TCP socket bound to `address` and listening; OSError says why not, in
    words to follow "cannot listen on ADDRESS: " ("in use by another process")."""
    host, port = split_host_port(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"unknown host {host!r} ({e.strerror})") from None
    family, kind, proto, _, where = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(128)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise OSError("the address is in use by another process") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise OSError("not an address of this machine") from None
        if e.errno == errno.EACCES:
            raise OSError("permission denied (ports below 1024 need privileges)") from None
        raise OSError(e.strerror or str(e)) from None
    return sock


def why_cannot_listen(address: str) -> str:
    """Why a server could not listen on `address` (gRPC says only that it could
    not): found by trying to bind it here."""
    try:
        bind_socket(address).close()
    except (OSError, ValueError) as e:
        return str(e)
    return "gRPC could not bind it (it is free now: another server may have just left it)"


def warn_plaintext(address: str) -> None:
    """Say once per process that gRPC goes in plaintext: a survey opens a channel
    per question and aggregator, and a warning each time buried everything else.
    At INFO: plaintext is only ever allowed on loopback, where it is the documented
    way to try veil, so a command line at its default level (warning) says nothing."""
    global _warned_plaintext
    if not _warned_plaintext:
        _warned_plaintext = True
        log.info(
            "plaintext gRPC to %s (loopback only; said once, for every loopback channel of"
            " this process)",
            address,
        )


def _credentials(
    address: str,
    root_certificates: bytes | None,
    private_key: bytes | None,
    certificate_chain: bytes | None,
    insecure: bool | None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials for `address`, or None for plaintext (loopback only)."""
    if insecure is None:
        insecure = root_certificates is None and is_loopback(address)
    if insecure:
        if not is_loopback(address):
            raise ValueError(f"refusing plaintext to non-loopback address {address}")
        warn_plaintext(address)
        return None
    return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)


def open_channel(
    address: str,
    root_certificates: bytes | None = None,
    private_key: bytes | None = None,
    certificate_chain: bytes | None = None,
    insecure: bool | None = None,
) -> grpc.Channel:
    """A channel to `address`. TLS (with the system roots unless given) except on
    loopback without certificates, where plaintext is used with a warning."""
    creds = _credentials(address, root_certificates, private_key, certificate_chain, insecure)
    if creds is None:
        return grpc.insecure_channel(address, options=_OPTIONS)
    return grpc.secure_channel(address, creds, options=_OPTIONS)


def open_aio_channel(
    address: str,
    root_certificates: bytes | None = None,
    private_key: bytes | None = None,
    certificate_chain: bytes | None = None,
    insecure: bool | None = None,
) -> grpc.aio.Channel:
    """`open_channel` for asyncio (grpc.aio), with the same TLS rules."""
    creds = _credentials(address, root_certificates, private_key, certificate_chain, insecure)
    if creds is None:
        return grpc.aio.insecure_channel(address, options=_OPTIONS)
    return grpc.aio.secure_channel(address, creds, options=_OPTIONS)

"""Channels to veil servers: TLS unless the address is on loopback."""

from __future__ import annotations

import ipaddress
import logging

import grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 << 20

# Statuses worth retrying with the same request.
TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class RpcRefused(Exception):
    """A veil server refused a call (or stayed unreachable); `code` is the
    gRPC status and `message` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_channel(
    address: str,
    root_certificates: bytes | None = None,
    private_key: bytes | None = None,
    certificate_chain: bytes | None = None,
    insecure: bool | None = None,
) -> grpc.Channel:
    """A channel to `address`. TLS (with the system roots unless given) except on
    loopback without certificates, where plaintext is used with a warning."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if insecure is None:
        insecure = root_certificates is None and is_loopback(address)
    if insecure:
        if not is_loopback(address):
            raise ValueError(f"refusing plaintext to non-loopback address {address}")
        log.warning("plaintext gRPC to %s (loopback only)", address)
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
    return grpc.secure_channel(address, creds, options=options)

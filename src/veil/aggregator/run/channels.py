"""gRPC options and the leader's channel to the helper (plaintext on loopback
only, else TLS as [helper_tls] says)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from veil.aggregator.run.config import ConfigError, ServerConfig
from veil.grpc_util import is_loopback, warn_plaintext


def read_pem(p: Path | None) -> bytes | None:
    """A configured key or certificate file's bytes (None if not configured)."""
    return p.read_bytes() if p is not None else None


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
    ]


def server_options(config: ServerConfig) -> list[tuple[str, int]]:
    """A server's gRPC options: those of grpc_options, and SO_REUSEPORT only on
    PostgreSQL, where several processes may serve one address (the kernel
    spreads connections over them). gRPC sets SO_REUSEPORT by default on
    Linux; on SQLite it is turned off, so a second process on the same
    address fails to bind instead of silently taking half the calls."""
    shared = not isinstance(config.storage, Path)
    return [*grpc_options(config), ("grpc.so_reuseport", 1 if shared else 0)]


def helper_channel_factory(config: ServerConfig) -> Any:
    def factory(address: str) -> grpc.Channel:
        options = grpc_options(config)
        t = config.helper_tls
        if t is None:
            if not is_loopback(address):
                raise ConfigError(
                    f"helper address {address} is not loopback: configure [helper_tls]"
                )
            warn_plaintext(address)
            return grpc.insecure_channel(address, options=options)
        creds = grpc.ssl_channel_credentials(read_pem(t.ca), read_pem(t.key), read_pem(t.cert))
        return grpc.secure_channel(address, creds, options=options)

    return factory

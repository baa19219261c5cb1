"""Logging set-up for the veil servers and commands.

Two formats: human-readable lines (default) and JSON lines (one object per
record, for log shippers). Records carry context such as ``task_id`` and
``job_id`` via ``extra=``. Never log a secret, a share or a measurement: the
``SecretFilter`` drops any ``extra`` field whose name says it is one, as a
second line of defence behind code review and the log-scanning tests.

gRPC's C core logs on its own, to stderr, at INFO ("Got goaway" when a peer
closes a connection, as every restart does): `quiet_grpc_core` sets
``GRPC_VERBOSITY=ERROR`` unless it is set already (set it to INFO or DEBUG to
see the core's lines), before the core starts; `veil` does so for every command.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

LEVEL_ENV = "VEIL_LOG_LEVEL"
GRPC_VERBOSITY_ENV = "GRPC_VERBOSITY"
# Standard LogRecord attributes: everything else on a record came from extra=.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_SECRET_WORDS = ("token", "secret", "key", "share", "shares", "measurement", "password", "seed")
_PUBLIC = {"key_id", "hpke_config_id"}  # identifiers of keys, not keys


class SecretFilter(logging.Filter):
    """Removes ``extra`` fields whose names suggest secret material."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in list(record.__dict__):
            words = name.lower().split("_")
            if (
                name not in _STANDARD
                and name not in _PUBLIC
                and any(w in words for w in _SECRET_WORDS)
            ):
                del record.__dict__[name]
        return True


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = value if isinstance(value, (int, float, bool, str)) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, sort_keys=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        context = [
            f"{name}={value}"
            for name, value in record.__dict__.items()
            if name not in _STANDARD and not name.startswith("_")
        ]
        return f"{base} [{' '.join(context)}]" if context else base


def resolve_level(configured: str | None) -> int:
    """The log level: the environment (``VEIL_LOG_LEVEL``) wins over the
    config file, which wins over INFO."""
    name = os.environ.get(LEVEL_ENV) or configured or "info"
    level = logging.getLevelNamesMapping().get(name.upper())
    if level is None:
        raise ValueError(f"unknown log level {name!r}; use debug, info, warning or error")
    return level


def configure_logging(
    level: str | None = None, json_lines: bool = False, stream: TextIO | None = None
) -> None:
    """Configure the ``veil`` logger tree (idempotent: replaces our handler)."""
    logger = logging.getLogger("veil")
    for handler in list(logger.handlers):
        if getattr(handler, "_veil", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._veil = True  # type: ignore[attr-defined]
    handler.setFormatter(JsonLinesFormatter() if json_lines else TextFormatter())
    handler.addFilter(SecretFilter())
    logger.addHandler(handler)
    logger.setLevel(resolve_level(level))
    logger.propagate = False


def quiet_grpc_core() -> None:
    """Only errors from gRPC's C core, unless GRPC_VERBOSITY says otherwise. The core
    reads it when it starts (the first channel or server), so call this before."""
    os.environ.setdefault(GRPC_VERBOSITY_ENV, "ERROR")

"""What every part of a task shares: its defaults, its error, and how bytes
and tokens are written (unpadded base64url; a token stored as its SHA-256,
compared in constant time).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from veil.settings import SettingsError
from veil.vdaf import registry

TASK_ID_SIZE = 32
# not_after of a task without an end (DAP leaves task_expiration optional).
OPEN_ENDED = 2**63 - 1
VDAF_TYPES = registry.NAMES
# A task file may also name a VDAF queried with an aggregation parameter
# (Poplar1: a text question's heavy hitters, collected level by level).
PREFIX_TYPES = tuple(registry.PREFIX_KINDS)
ALL_VDAF_TYPES = (*VDAF_TYPES, *PREFIX_TYPES)
# The most candidate prefixes one Poplar1 query may name: both aggregators
# refuse more (an aggregation parameter costs each of them one IDPF node per
# prefix per report, and draws one noise value per prefix ahead of time).
# 16,384 is every one-byte extension of 64 candidates.
MAX_QUERY_PREFIXES = 16384

# Each default is written here once; the dataclasses, the file reader,
# `new_task` and the `veil task new` options all take it from here.
DEFAULT_TIME_PRECISION = 3600
DEFAULT_NOT_BEFORE = 0
DEFAULT_NOT_AFTER = OPEN_ENDED
DEFAULT_MAX_CLOCK_SKEW = 60
DEFAULT_DP_MODE = "independent"
# What `veil task new` proposes; a task file must state its own.
DEFAULT_MIN_BATCH_SIZE = 10


class TaskError(SettingsError):
    """A task definition is malformed or incomplete for the role reading it."""


def b64e(data: bytes) -> str:
    """`data` as unpadded base64url text."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64d(text: str) -> bytes:
    """The bytes of unpadded base64url `text`; TaskError if it is not that."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as e:
        raise TaskError(f"not base64url: {text[:16]!r}") from e


def hash_token(token: str) -> bytes:
    """How tokens are stored by the side that checks them."""
    return hashlib.sha256(token.encode()).digest()


def token_matches(token: str, stored_hash: bytes) -> bool:
    """Whether `token` is the one `stored_hash` was made from (constant time)."""
    return hmac.compare_digest(hash_token(token), stored_hash)

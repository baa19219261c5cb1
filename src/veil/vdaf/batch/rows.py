"""Per-report errors of a batch, and its byte strings as rows: what the
batched Prio3 and Poplar1 engines share.

A batch carries one ``VdafError | None`` per report; a report that fails
stops there (its first error is the one kept) while the others go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from veil.vdaf.batch.field import Arr
from veil.vdaf.errors import CodecError, VdafError

Errors = list[VdafError | None]


def ok_mask(errors: Errors) -> Arr:
    """True for each report without an error."""
    return np.array([e is None for e in errors], dtype=bool)


def flag(errors: Errors, mask: Any, error: VdafError) -> None:
    """Record ``error`` for each report selected by ``mask`` that has none yet."""
    for i in np.flatnonzero(mask):
        if errors[i] is None:
            errors[i] = error


def byte_rows(values: Sequence[bytes | None], length: int, what: str, errors: Errors) -> Arr:
    """A ``(len(values), length)`` byte array; a row of another length (or
    None) is zero and recorded as a ``CodecError``."""
    # The usual case, with no per-row Python work: the join (which refuses
    # a None) holds every row's bytes, and none is longer than ``length``.
    try:
        joined = b"".join(cast(Sequence[bytes], values))
        fits = len(joined) == len(values) * length
        fits = fits and max(map(len, cast(Sequence[bytes], values)), default=0) <= length
    except TypeError:  # a None
        fits = False
    if fits:
        return np.frombuffer(joined, dtype=np.uint8).reshape(len(values), length)
    blank = bytes(length)
    parts = []
    for i, v in enumerate(values):
        if v is None or len(v) != length:
            if errors[i] is None:
                got = "nothing" if v is None else f"{len(v)} bytes"
                errors[i] = CodecError(f"{what} must be {length} bytes, got {got}")
            parts.append(blank)
        else:
            parts.append(v)
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(len(values), length)

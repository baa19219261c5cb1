"""Reports' encoded values as rows of one array (veil.vdaf.batch.rows):
each row of the wrong length, or missing, gets its own error."""

from __future__ import annotations

from veil.vdaf.batch.rows import byte_rows
from veil.vdaf.errors import VdafError


def test_byte_rows_flags_each_bad_row() -> None:
    # Lengths that add up to the right total are still caught row by row.
    errors: list[VdafError | None] = [None] * 4
    rows = byte_rows([b"abcd", b"abc", b"abcde", None], 4, "share", errors)
    assert rows.shape == (4, 4)
    assert rows[0].tobytes() == b"abcd" and not rows[1:].any()
    assert errors[0] is None
    assert [str(e) for e in errors[1:]] == [
        "share must be 4 bytes, got 3 bytes",
        "share must be 4 bytes, got 5 bytes",
        "share must be 4 bytes, got nothing",
    ]
    clean: list[VdafError | None] = [None] * 2
    assert byte_rows([b"ab", b"cd"], 2, "share", clean).tobytes() == b"abcd"
    assert clean == [None, None]
    assert byte_rows([], 3, "share", []).shape == (0, 3)

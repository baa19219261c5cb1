"""The TLS presentation language's encoding (RFC 8446 section 3), as DAP
uses it: big-endian unsigned integers of 1, 2, 4 and 8 bytes, fixed-length
byte strings, and vectors whose length in bytes precedes them in 1, 2 or 4
bytes, with the bounds a definition gives (``opaque payload<1..2^32-1>``).

`Reader` decodes and refuses whatever is not an encoding: a field that runs
past the end, a length outside its bounds, bytes left over after the last
field. Each refusal is a `DecodeError` that names the message and the field
(``Report.public_share: length 9 runs past the end (4 bytes left)``), so a
problem document can say what was wrong. The `put_*` functions encode and
refuse a value that does not fit its field (ValueError): encoding is for
values veil built, decoding for bytes anyone sent.
"""

from __future__ import annotations

from veil.messages import MessageError

_UINT_SIZES = (1, 2, 4, 8)
_ZEROS = {n: bytes(n) for n in (1, 2, 4)}


class DecodeError(MessageError):
    """Bytes that are not the encoding of the DAP message they were read as
    (DAP's error type for them is invalidMessage)."""


class Reader:
    """A cursor over one message's bytes. `what` names the message in
    errors; each read names its field."""

    __slots__ = ("_data", "_pos", "what")

    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self._data = bytes(data)
        self._pos = 0
        self.what = what

    def _fail(self, field: str, problem: str) -> DecodeError:
        return DecodeError(f"{self.what}.{field}: {problem}")

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def take(self, n: int, field: str) -> bytes:
        """The next `n` bytes (a fixed-length field such as ReportID[16])."""
        # Read once per field of every report of a job: kept to the bone.
        pos = self._pos
        end = pos + n
        if end > len(self._data):
            raise self._fail(field, f"needs {n} bytes, {len(self._data) - pos} left")
        self._pos = end
        return self._data[pos:end]

    def uint(self, size: int, field: str) -> int:
        """A big-endian unsigned integer of `size` bytes (uint8 to uint64)."""
        # Read several times for every report of a job: the bounds check
        # inline, as in take.
        pos = self._pos
        end = pos + size
        if end > len(self._data):
            raise self._fail(field, f"needs {size} bytes, {len(self._data) - pos} left")
        self._pos = end
        return int.from_bytes(self._data[pos:end])

    def opaque(
        self, prefix: int, field: str, minimum: int = 0, maximum: int | None = None
    ) -> bytes:
        """A vector of bytes with a `prefix`-byte length: ``opaque
        field<minimum..maximum>``, the maximum being the prefix's own unless
        given."""
        data = self._data
        pos = self._pos
        start = pos + prefix
        if start > len(data):
            raise self._fail(field, f"needs {prefix} bytes, {len(data) - pos} left")
        length = int.from_bytes(data[pos:start])
        self._pos = start
        if length < minimum:
            raise self._fail(field, f"length {length} is below the minimum {minimum}")
        if maximum is not None and length > maximum:
            raise self._fail(field, f"length {length} is above the maximum {maximum}")
        end = start + length
        if end > len(data):
            raise self._fail(field, f"length {length} runs past the end ({self.remaining} left)")
        self._pos = end
        return data[start:end]

    def empty_vector(self, prefix: int) -> bool:
        """Whether the next field is a vector of length 0 (its `prefix`
        zero bytes), read if so: the common case of a list of extensions,
        without a Reader of its own."""
        pos = self._pos
        if self._data[pos : pos + prefix] == _ZEROS[prefix]:
            self._pos = pos + prefix
            return True
        return False

    def vector(self, prefix: int, field: str, what: str, minimum: int = 0) -> Reader:
        """A vector of structures with a `prefix`-byte length in bytes, as a
        Reader of its own (named `what`) that must be read to its end."""
        return Reader(self.opaque(prefix, field, minimum), what)

    def end(self) -> None:
        """Refuse bytes left over after the message's last field."""
        if self.remaining:
            raise DecodeError(f"{self.what}: {self.remaining} bytes after the end of the message")


def put_uint(value: int, size: int, field: str) -> bytes:
    """`value` as a big-endian integer of `size` bytes."""
    assert size in _UINT_SIZES
    if not 0 <= value < 1 << (8 * size):
        raise ValueError(f"{field}: {value} does not fit in uint{8 * size}")
    return value.to_bytes(size, "big")


def put_fixed(data: bytes, size: int, field: str) -> bytes:
    """A fixed-length field: `data` must be exactly `size` bytes."""
    if len(data) != size:
        raise ValueError(f"{field}: {len(data)} bytes where the field has {size}")
    return bytes(data)


def put_opaque(
    data: bytes, prefix: int, field: str, minimum: int = 0, maximum: int | None = None
) -> bytes:
    """``opaque field<minimum..maximum>`` with a `prefix`-byte length."""
    top = (1 << (8 * prefix)) - 1 if maximum is None else maximum
    if not minimum <= len(data) <= top:
        raise ValueError(f"{field}: length {len(data)} is outside {minimum}..{top}")
    return put_uint(len(data), prefix, field) + bytes(data)

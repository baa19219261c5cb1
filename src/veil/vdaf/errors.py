"""Exceptions raised by the Prio3 core."""


class VdafError(Exception):
    """Base class of every error the VDAF layer raises on bad input."""


class CodecError(VdafError, ValueError):
    """Bytes that are not a valid encoding: wrong length, trailing bytes,
    or a field element that is not reduced modulo the prime."""


class VerifyError(VdafError):
    """A report failed verification: the validity proof was rejected, the
    joint randomness did not match, or a query point was degenerate."""

"""Exceptions raised by the VDAFs (Prio3 and Poplar1)."""


class VdafError(Exception):
    """Base class of every error the VDAF layer raises on bad input."""


class CodecError(VdafError, ValueError):
    """Bytes that are not a valid encoding: wrong length, trailing bytes,
    or a field element that is not reduced modulo the prime."""


class VerifyError(VdafError):
    """A report failed verification: the validity proof was rejected, the
    joint randomness did not match, or a query point was degenerate."""


class AggParamError(VdafError, ValueError):
    """An aggregation parameter that may not be used: a level out of range,
    prefixes of the wrong length, repeated or out of order (Poplar1)."""


class TooManyPrefixes(AggParamError):
    """More candidate prefixes in one aggregation parameter than the
    instance's bound (``Poplar1.max_prefixes``)."""


class AggParamSequenceError(AggParamError):
    """An aggregation parameter that breaks the draft's rule across the
    parameters already used with the same reports (Poplar1: levels strictly
    increase, each prefix extends one of the previous level's)."""

"""Validity circuits (draft-irtf-cfrg-vdaf-18, Section 7.4).

A circuit fixes how a measurement is encoded as a vector of field elements,
which affine-plus-gadget computation is zero exactly on valid encodings,
how an encoding is truncated to the aggregatable output, and how an
aggregate decodes. Circuits know nothing about proofs: ``eval`` receives
the gadgets to call, so the FLP can record their inputs (proving) or answer
from the proof (querying) while the circuit code stays the same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from veil.vdaf.spec.field import Field
from veil.vdaf.spec.gadgets import Gadget, Mul, ParallelSum, PolyEval

Measurement = TypeVar("Measurement")
AggResult = TypeVar("AggResult")

# What a circuit calls in place of each gadget: field elements in, one out.
GadgetCall = Callable[[Sequence[int]], int]


def _require_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """Check a parameter or measurement is an int (not a bool) in
    ``[low, high]``; raise ``ValueError`` naming the constraint."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, not {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bound}, got {value}")
    return value


def _require_sequence(name: str, value: object, length: int) -> Sequence[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a sequence of {length} entries")
    if len(value) != length:
        raise ValueError(f"{name} must have exactly {length} entries, got {len(value)}")
    return value


class Valid(ABC, Generic[Measurement, AggResult]):
    """A validity circuit with its affine-aggregatable encoding."""

    field: type[Field]
    MEAS_LEN: int
    JOINT_RAND_LEN: int
    OUTPUT_LEN: int
    EVAL_OUTPUT_LEN: int
    GADGETS: list[Gadget]
    GADGET_CALLS: list[int]

    @abstractmethod
    def encode(self, measurement: Measurement) -> list[int]:
        """Encode a measurement; ``ValueError`` if it is out of range or ill-typed."""

    @abstractmethod
    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        """Evaluate on (a share of) an encoded measurement. On a valid
        encoding with honest gadgets the ``EVAL_OUTPUT_LEN`` outputs are zero.
        Affine constants are divided by ``num_shares`` so shares add up."""

    @abstractmethod
    def truncate(self, meas: Sequence[int]) -> list[int]:
        """Map (a share of) an encoded measurement to ``OUTPUT_LEN`` elements."""

    @abstractmethod
    def decode(self, output: Sequence[int], num_measurements: int) -> AggResult:
        """Decode an aggregate of ``OUTPUT_LEN`` elements."""

    def eval_direct(self, meas: Sequence[int], joint_rand: Sequence[int]) -> list[int]:
        """Evaluate with the real gadgets, on a whole encoded measurement."""
        calls = [self._direct_call(g) for g in self.GADGETS]
        return self.eval(meas, joint_rand, 1, calls)

    def _direct_call(self, gadget: Gadget) -> GadgetCall:
        field = self.field
        return lambda inp: gadget.eval(field, inp)


def encode_range_checked_int(field: type[Field], value: int, max_measurement: int) -> list[int]:
    """Encode ``value`` in ``[0, max_measurement]`` as bits with weights
    1, 2, 4, ..., 2^(b-2) and a last weight ``max_measurement - (2^(b-1) - 1)``,
    so that every 0/1 vector decodes into the range and nothing else does."""
    bits = max_measurement.bit_length()
    rest_all_ones = (1 << (bits - 1)) - 1
    if value <= rest_all_ones:
        rest, last = value, 0
    else:
        rest, last = value - (max_measurement - rest_all_ones), 1
    return [(rest >> i) & 1 for i in range(bits - 1)] + [last]


def decode_range_checked_int(
    field: type[Field], encoded: Sequence[int], max_measurement: int
) -> int:
    """Inverse of ``encode_range_checked_int``; linear, so it also maps shares."""
    bits = max_measurement.bit_length()
    last_weight = max_measurement - ((1 << (bits - 1)) - 1)
    total = sum(bit << i for i, bit in enumerate(encoded[: bits - 1]))
    return (total + last_weight * encoded[bits - 1]) % field.MODULUS


def chunked_bit_check(
    field: type[Field],
    meas: Sequence[int],
    joint_rand: Sequence[int],
    num_shares: int,
    calls: int,
    chunk_length: int,
    gadget: GadgetCall,
) -> int:
    """The range check shared by SumVec, Histogram, MultihotCountVec and
    L1BoundSum: a random linear combination (powers of ``joint_rand[i]``
    within chunk i) of ``x * (x - 1)`` over every entry, with each chunk one
    ParallelSum call."""
    p = field.MODULUS
    shares_inv = pow(num_shares, -1, p)
    total = 0
    for i in range(calls):
        r = joint_rand[i]
        r_power = r
        inputs = [0] * (2 * chunk_length)
        base = i * chunk_length
        for j in range(chunk_length):
            index = base + j
            x = meas[index] if index < len(meas) else 0
            inputs[2 * j] = r_power * x % p
            inputs[2 * j + 1] = (x - shares_inv) % p
            r_power = r_power * r % p
        total += gadget(inputs)
    return total % p


class ChunkedBitCircuit(Valid[Measurement, AggResult]):
    """A circuit whose encoding is bits checked in chunks of ``chunk_length``
    by one ParallelSum(Mul) gadget, one call per chunk."""

    chunk_length: int

    def bit_check(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> int:
        return chunked_bit_check(
            self.field,
            meas,
            joint_rand,
            num_shares,
            self.GADGET_CALLS[0],
            self.chunk_length,
            gadgets[0],
        )


class Count(Valid[int, int]):
    """A measurement of 0 or 1; valid iff ``x * x - x == 0``."""

    MEAS_LEN = 1
    JOINT_RAND_LEN = 0
    OUTPUT_LEN = 1
    EVAL_OUTPUT_LEN = 1

    def __init__(self, field: type[Field]) -> None:
        self.field = field
        self.GADGETS = [Mul()]
        self.GADGET_CALLS = [1]

    def encode(self, measurement: int) -> list[int]:
        return [_require_int("Count measurement", measurement, 0, 1)]

    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        return [(gadgets[0]([meas[0], meas[0]]) - meas[0]) % self.field.MODULUS]

    def truncate(self, meas: Sequence[int]) -> list[int]:
        return list(meas)

    def decode(self, output: Sequence[int], num_measurements: int) -> int:
        return output[0]


class Sum(Valid[int, int]):
    """An integer in ``[0, max_measurement]``, encoded with
    ``encode_range_checked_int``; each bit checked by ``PolyEval(x^2 - x)``."""

    JOINT_RAND_LEN = 0
    OUTPUT_LEN = 1

    def __init__(self, field: type[Field], max_measurement: int) -> None:
        _require_int("max_measurement", max_measurement, 1)
        self.field = field
        self.max_measurement = max_measurement
        self.bits = max_measurement.bit_length()
        if 1 << self.bits >= field.MODULUS:
            raise ValueError(f"max_measurement needs {self.bits} bits; too large for the field")
        self.GADGETS = [PolyEval([0, -1, 1])]
        self.GADGET_CALLS = [self.bits]
        self.MEAS_LEN = self.bits
        self.EVAL_OUTPUT_LEN = self.bits

    def encode(self, measurement: int) -> list[int]:
        _require_int("Sum measurement", measurement, 0, self.max_measurement)
        return encode_range_checked_int(self.field, measurement, self.max_measurement)

    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        return [gadgets[0]([b]) for b in meas]

    def truncate(self, meas: Sequence[int]) -> list[int]:
        return [decode_range_checked_int(self.field, meas, self.max_measurement)]

    def decode(self, output: Sequence[int], num_measurements: int) -> int:
        return output[0]


class SumVec(ChunkedBitCircuit[Sequence[int], list[int]]):
    """A vector of ``length`` integers, each in ``[0, max_measurement]``."""

    EVAL_OUTPUT_LEN = 1

    def __init__(
        self, field: type[Field], length: int, max_measurement: int, chunk_length: int
    ) -> None:
        _require_int("length", length, 1)
        _require_int("max_measurement", max_measurement, 1)
        _require_int("chunk_length", chunk_length, 1)
        self.field = field
        self.length = length
        self.max_measurement = max_measurement
        self.chunk_length = chunk_length
        self.bits = max_measurement.bit_length()
        if 1 << self.bits >= field.MODULUS:
            raise ValueError(f"max_measurement needs {self.bits} bits; too large for the field")
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [-(-length * self.bits // chunk_length)]
        self.MEAS_LEN = length * self.bits
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement: Sequence[int]) -> list[int]:
        _require_sequence("SumVec measurement", measurement, self.length)
        encoded: list[int] = []
        for i, value in enumerate(measurement):
            _require_int(f"SumVec measurement[{i}]", value, 0, self.max_measurement)
            encoded += encode_range_checked_int(self.field, value, self.max_measurement)
        return encoded

    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        return [self.bit_check(meas, joint_rand, num_shares, gadgets)]

    def truncate(self, meas: Sequence[int]) -> list[int]:
        b = self.bits
        return [
            decode_range_checked_int(self.field, meas[i * b : (i + 1) * b], self.max_measurement)
            for i in range(self.length)
        ]

    def decode(self, output: Sequence[int], num_measurements: int) -> list[int]:
        return list(output)


class Histogram(ChunkedBitCircuit[int, list[int]]):
    """An index in ``[0, length)``, one-hot encoded; valid iff every entry
    is a bit and the entries sum to one."""

    EVAL_OUTPUT_LEN = 2

    def __init__(self, field: type[Field], length: int, chunk_length: int) -> None:
        _require_int("length", length, 1)
        _require_int("chunk_length", chunk_length, 1)
        self.field = field
        self.length = length
        self.chunk_length = chunk_length
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [-(-length // chunk_length)]
        self.MEAS_LEN = length
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement: int) -> list[int]:
        _require_int("Histogram measurement", measurement, 0, self.length - 1)
        encoded = [0] * self.length
        encoded[measurement] = 1
        return encoded

    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        p = self.field.MODULUS
        range_check = self.bit_check(meas, joint_rand, num_shares, gadgets)
        sum_check = (sum(meas) - pow(num_shares, -1, p)) % p
        return [range_check, sum_check]

    def truncate(self, meas: Sequence[int]) -> list[int]:
        return list(meas)

    def decode(self, output: Sequence[int], num_measurements: int) -> list[int]:
        return list(output)


class MultihotCountVec(ChunkedBitCircuit[Sequence[bool], list[int]]):
    """A bit vector of ``length`` entries with at most ``max_weight`` ones;
    the client also encodes the claimed weight, range-checked like Sum."""

    EVAL_OUTPUT_LEN = 2

    def __init__(self, field: type[Field], length: int, max_weight: int, chunk_length: int) -> None:
        _require_int("length", length, 1)
        _require_int("max_weight", max_weight, 1, length)
        _require_int("chunk_length", chunk_length, 1)
        if length >= field.MODULUS:
            raise ValueError("length is too large for the field")
        self.field = field
        self.length = length
        self.max_weight = max_weight
        self.chunk_length = chunk_length
        self.bits_for_weight = max_weight.bit_length()
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.GADGET_CALLS = [-(-(length + self.bits_for_weight) // chunk_length)]
        self.MEAS_LEN = length + self.bits_for_weight
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement: Sequence[bool]) -> list[int]:
        _require_sequence("MultihotCountVec measurement", measurement, self.length)
        counts = []
        for i, x in enumerate(measurement):
            if x not in (0, 1) or not isinstance(x, int):
                raise ValueError(f"MultihotCountVec measurement[{i}] must be a bool, got {x!r}")
            counts.append(int(x))
        weight = sum(counts)
        if weight > self.max_weight:
            raise ValueError(
                f"MultihotCountVec measurement has {weight} entries set; "
                f"at most max_weight={self.max_weight} are allowed"
            )
        return counts + encode_range_checked_int(self.field, weight, self.max_weight)

    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        p = self.field.MODULUS
        range_check = self.bit_check(meas, joint_rand, num_shares, gadgets)
        weight = sum(meas[: self.length])
        reported = decode_range_checked_int(self.field, meas[self.length :], self.max_weight)
        return [range_check, (weight - reported) % p]

    def truncate(self, meas: Sequence[int]) -> list[int]:
        return list(meas[: self.length])

    def decode(self, output: Sequence[int], num_measurements: int) -> list[int]:
        return list(output)


class L1BoundSum(ChunkedBitCircuit[Sequence[int], list[int]]):
    """A vector of ``length`` non-negative integers whose sum (its L1 norm)
    is at most ``max_value`` (draft-ietf-ppm-l1-bound-sum-02, Section 3).

    Each entry and then the claimed sum are encoded like SumVec's entries,
    ``bits = max_value.bit_length()`` range-checked bits each; the circuit
    checks every bit in chunks as SumVec does and that the entries decode
    to the claimed sum. Only the entries are aggregated.
    """

    EVAL_OUTPUT_LEN = 2

    def __init__(self, field: type[Field], length: int, max_value: int, chunk_length: int) -> None:
        _require_int("length", length, 1)
        _require_int("max_value", max_value, 1)
        _require_int("chunk_length", chunk_length, 1)
        self.field = field
        self.length = length
        self.max_value = max_value
        self.chunk_length = chunk_length
        self.bits = max_value.bit_length()
        # Entries and sum each decode into [0, max_value]: the weight check,
        # made modulo p, equates integers only if the entries' greatest sum
        # stays below p.
        if length * max_value >= field.MODULUS:
            raise ValueError("length * max_value is too large for the field")
        self.GADGETS = [ParallelSum(Mul(), chunk_length)]
        self.MEAS_LEN = (length + 1) * self.bits
        self.GADGET_CALLS = [-(-self.MEAS_LEN // chunk_length)]
        self.OUTPUT_LEN = length
        self.JOINT_RAND_LEN = self.GADGET_CALLS[0]

    def encode(self, measurement: Sequence[int]) -> list[int]:
        _require_sequence("L1BoundSum measurement", measurement, self.length)
        encoded: list[int] = []
        for i, value in enumerate(measurement):
            _require_int(f"L1BoundSum measurement[{i}]", value, 0, self.max_value)
            encoded += encode_range_checked_int(self.field, value, self.max_value)
        total = sum(measurement)
        if total > self.max_value:
            raise ValueError(
                f"L1BoundSum measurement sums to {total}; at most max_value={self.max_value}"
            )
        return encoded + encode_range_checked_int(self.field, total, self.max_value)

    def eval(
        self,
        meas: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
        gadgets: Sequence[GadgetCall],
    ) -> list[int]:
        p = self.field.MODULUS
        range_check = self.bit_check(meas, joint_rand, num_shares, gadgets)
        b = self.bits
        observed = sum(
            decode_range_checked_int(self.field, meas[i * b : (i + 1) * b], self.max_value)
            for i in range(self.length)
        )
        claimed = decode_range_checked_int(self.field, meas[self.length * b :], self.max_value)
        return [range_check, (observed - claimed) % p]

    def truncate(self, meas: Sequence[int]) -> list[int]:
        b = self.bits
        return [
            decode_range_checked_int(self.field, meas[i * b : (i + 1) * b], self.max_value)
            for i in range(self.length)
        ]

    def decode(self, output: Sequence[int], num_measurements: int) -> list[int]:
        return list(output)

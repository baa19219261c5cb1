"""Validity circuits (draft-irtf-cfrg-vdaf-18, Section 7.4) evaluated on
many reports at once, for the batched FLP in ``veil.vdaf.batch.flp``.

A batched circuit sees field arrays with one row per report
(``(reports, MEAS_LEN)`` measurements, ``(reports, JOINT_RAND_LEN)`` joint
randomness) and returns, for each gadget, the inputs of every call
(``(reports, ARITY, calls)``) and the circuit output
(``(reports, EVAL_OUTPUT_LEN)``) given the gadget outputs. None of the
draft's circuits feeds a gadget output into a gadget input, so the wires
never depend on the outputs; ``LiftedCircuit`` makes no such assumption.

``batch_circuit`` picks a hand-vectorised circuit for the draft's types and
falls back to ``LiftedCircuit``, which runs the scalar circuit code itself
on columns of the batch: slower, but correct for any circuit.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from veil.vdaf.batch.field import Arr, VecField, VecField128, vec_field
from veil.vdaf.batch.kernels import kernels
from veil.vdaf.spec import circuits
from veil.vdaf.spec.gadgets import Gadget, Mul, ParallelSum, PolyEval


class BatchCircuit(ABC):
    """A validity circuit over a batch of reports."""

    def __init__(self, valid: circuits.Valid[Any, Any]) -> None:
        self.valid = valid
        self.vf: type[VecField] = vec_field(valid.field)

    def encode(self, measurements: Sequence[Any]) -> Arr:
        """``(reports, MEAS_LEN)``; ``ValueError`` naming the first bad one."""
        encoded = []
        for i, m in enumerate(measurements):
            try:
                encoded.append(self.valid.encode(m))
            except ValueError as e:
                raise ValueError(f"measurement {i}: {e}") from e
        if not encoded:
            return self.vf.zeros((0, self.valid.MEAS_LEN))
        return self.vf.from_ints(encoded)

    @abstractmethod
    def eval(
        self,
        meas: Arr,
        joint_rand: Arr,
        num_shares: int,
        gadget_outputs: Sequence[Arr] | None,
    ) -> tuple[list[Arr], Arr | None]:
        """Wires per gadget and, if ``gadget_outputs`` (``(reports, calls)``
        per gadget) is given, the circuit output; else ``None``."""

    @abstractmethod
    def truncate(self, meas: Arr) -> Arr:
        """``(reports, OUTPUT_LEN)``."""

    def wire_evals(
        self,
        meas: Arr,
        joint_rand: Arr,
        num_shares: int,
        gadget_outputs: Sequence[Arr],
        seeds: Sequence[Arr],
        weights: Sequence[Arr],
    ) -> tuple[list[Arr], Arr] | None:
        """Optionally, a shortcut for the verifier: each gadget's wire
        polynomials evaluated at the query point, ``(reports, ARITY)``, given
        the seeds and the Lagrange weights ``(reports, P)`` of that point,
        together with the circuit output. ``None``: no shortcut, the FLP
        evaluates the wires from ``eval``."""
        return None


class _Column:
    """A batch of field elements (one per report) behaving like the ints the
    scalar circuits compute with: ``% p`` is the identity, ints are
    constants, ``<<`` multiplies by a power of two."""

    __slots__ = ("a", "vf")

    def __init__(self, vf: type[VecField], a: Arr) -> None:
        self.vf = vf
        self.a = a

    def _other(self, other: object) -> Arr:
        if isinstance(other, _Column):
            return other.a
        if isinstance(other, int) and not isinstance(other, bool):
            return self.vf.constant(other)
        raise TypeError(f"cannot combine a batched field element with {type(other).__name__}")

    def __add__(self, other: object) -> _Column:
        return _Column(self.vf, self.vf.add(self.a, self._other(other)))

    __radd__ = __add__

    def __sub__(self, other: object) -> _Column:
        return _Column(self.vf, self.vf.sub(self.a, self._other(other)))

    def __rsub__(self, other: object) -> _Column:
        return _Column(self.vf, self.vf.sub(self._other(other), self.a))

    def __mul__(self, other: object) -> _Column:
        return _Column(self.vf, self.vf.mul(self.a, self._other(other)))

    __rmul__ = __mul__

    def __neg__(self) -> _Column:
        return _Column(self.vf, self.vf.neg(self.a))

    def __lshift__(self, shift: int) -> _Column:
        return self * (1 << shift)

    def __mod__(self, modulus: int) -> _Column:
        if modulus != self.vf.MODULUS:
            raise ValueError("batched field elements reduce only modulo their own prime")
        return self


def _columns(vf: type[VecField], a: Arr) -> list[_Column]:
    return [_Column(vf, a[..., i]) for i in range(vf.elem_shape(a)[-1])]


def _from_columns(vf: type[VecField], cols: Sequence[object], rows: int) -> Arr:
    arrays = []
    for c in cols:
        if isinstance(c, _Column):
            arrays.append(c.a)
        else:
            arrays.append(vf.constant(int(c) % vf.MODULUS, (rows,)))  # type: ignore[call-overload]
    if not arrays:
        return vf.zeros((rows, 0))
    full = [vf.add(x, vf.zeros((rows,))) for x in arrays]  # broadcast constants
    return vf.stack(full, axis=-1)


def gadget_eval(vf: type[VecField], gadget: Gadget, inp: Arr) -> Arr:
    """Evaluate ``gadget`` on ``inp`` of shape ``(..., ARITY, X)``, giving
    ``(..., X)``: point by point, as ``Gadget.eval_poly`` does."""
    if isinstance(gadget, Mul):
        return vf.mul(inp[..., 0, :], inp[..., 1, :])
    if isinstance(gadget, PolyEval):
        x = inp[..., 0, :]
        acc = vf.constant(gadget.coeffs[-1] % vf.MODULUS)
        acc = vf.add(vf.zeros(vf.elem_shape(x)), acc)
        for c in reversed(gadget.coeffs[:-1]):
            acc = vf.add(vf.mul(acc, x), vf.constant(c % vf.MODULUS))
        return acc
    if isinstance(gadget, ParallelSum) and isinstance(gadget.subcircuit, Mul):
        return vf.dot(inp[..., 0::2, :], inp[..., 1::2, :], axis=-2)
    if isinstance(gadget, ParallelSum):
        sub = gadget.subcircuit
        parts = [
            gadget_eval(vf, sub, inp[..., i * sub.ARITY : (i + 1) * sub.ARITY, :])
            for i in range(gadget.count)
        ]
        return vf.sum(vf.stack(parts, axis=-2), axis=-2)
    # Any other gadget: run its scalar code on columns.
    shape = vf.elem_shape(inp)
    rows = int(np.prod(shape[:-2], dtype=np.int64)) * shape[-1]
    flat = vf.reshape(vf.moveaxis(inp, -2, -1), (rows, shape[-2]))
    out = gadget.eval(vf.field, _columns(vf, flat))  # type: ignore[arg-type]
    res = _from_columns(vf, [out], rows)[..., 0]
    return vf.reshape(res, shape[:-2] + shape[-1:])


class LiftedCircuit(BatchCircuit):
    """Any circuit, by running its scalar ``eval`` on columns of the batch."""

    def eval(
        self,
        meas: Arr,
        joint_rand: Arr,
        num_shares: int,
        gadget_outputs: Sequence[Arr] | None,
    ) -> tuple[list[Arr], Arr | None]:
        vf = self.vf
        rows = vf.elem_shape(meas)[0]
        recorded: list[list[list[object]]] = [[] for _ in self.valid.GADGETS]

        def make_call(index: int, gadget: Gadget) -> Any:
            def call(inp: Sequence[object]) -> object:
                k = len(recorded[index])
                recorded[index].append(list(inp))
                if gadget_outputs is not None:
                    return _Column(vf, gadget_outputs[index][..., k])
                wires = _from_columns(vf, inp, rows)[..., None]
                return _Column(vf, gadget_eval(vf, gadget, wires)[..., 0])

            return call

        calls = [make_call(i, g) for i, g in enumerate(self.valid.GADGETS)]
        out = self.valid.eval(
            _columns(vf, meas),  # type: ignore[arg-type]
            _columns(vf, joint_rand),  # type: ignore[arg-type]
            num_shares,
            calls,
        )
        wires = []
        for g, rec, count in zip(
            self.valid.GADGETS, recorded, self.valid.GADGET_CALLS, strict=True
        ):
            if len(rec) != count:
                raise ValueError("circuit made a different number of gadget calls")
            per_call = [_from_columns(vf, inp, rows) for inp in rec]  # (rows, ARITY)
            if per_call:
                wires.append(vf.stack(per_call, axis=-1))
            else:
                wires.append(vf.zeros((rows, g.ARITY, 0)))
        if gadget_outputs is None:
            return wires, None
        return wires, _from_columns(vf, out, rows)

    def truncate(self, meas: Arr) -> Arr:
        rows = self.vf.elem_shape(meas)[0]
        return _from_columns(
            self.vf,
            self.valid.truncate(_columns(self.vf, meas)),  # type: ignore[arg-type]
            rows,
        )


# -- the draft's circuits, vectorised ------------------------------------


def _check_int(name: str, value: object, low: int, high: int) -> int:
    return circuits._require_int(name, value, low, high)


def _all_ints_in(values: Sequence[object], low: int, high: int) -> bool:
    """Fast path of the measurement checks (``type(x) is int`` excludes
    bools); on ``False`` the caller runs the per-value check that names the
    culprit."""
    ints: list[int] = [x for x in values if type(x) is int]
    if len(ints) != len(values):
        return False
    return not ints or (low <= min(ints) and max(ints) <= high)


def _int64_table(rows: list[Sequence[Any]], length: int, high: int) -> Arr | None:
    """Fast path of a vector measurement's checks: the rows (each already
    `length` long) as one ``(len(rows), length)`` int64 array if every entry
    is an int (not a bool) in ``[0, high]``, checked on the whole batch at
    once; None otherwise, and the caller's per-value checks name the
    culprit."""
    if high >= 1 << 62 or not set(map(type, itertools.chain.from_iterable(rows))) <= {int}:
        return None
    try:
        vals = np.array(rows, dtype=np.int64).reshape(len(rows), length)
    except OverflowError:  # an int beyond int64: out of range anyway
        return None
    if vals.size and (int(vals.min()) < 0 or int(vals.max()) > high):
        return None
    return vals


def _range_checked_bits(values: Arr, max_measurement: int) -> Arr:
    """``encode_range_checked_int`` on a ``uint64``/object array of values:
    ``(..., bits)`` of 0/1."""
    bits = max_measurement.bit_length()
    rest_all_ones = (1 << (bits - 1)) - 1
    obj = values if values.dtype == np.int64 else values.astype(object)
    last = obj > rest_all_ones
    rest = np.where(last, obj - (max_measurement - rest_all_ones), obj)
    out = np.zeros((*values.shape, bits), dtype=np.uint64)
    for i in range(bits - 1):
        out[..., i] = ((rest >> i) & 1).astype(np.uint64)
    out[..., bits - 1] = last.astype(np.uint64)
    return out


def _range_weights(max_measurement: int) -> list[int]:
    """The weights of ``encode_range_checked_int``'s bits."""
    bits = max_measurement.bit_length()
    weights = [1 << i for i in range(bits - 1)]
    weights.append(max_measurement - ((1 << (bits - 1)) - 1))
    return weights


def _bits_to_field(vf: type[VecField], bits: Arr) -> Arr:
    if vf.ENCODED_SIZE == 8:
        return bits.astype(np.uint64)
    zero = np.zeros(bits.shape, dtype=np.int64)
    return np.stack([bits.astype(np.int64), zero, zero, zero])


def powers(vf: type[VecField], r: Arr, count: int) -> Arr:
    """``(..., count)`` array of ``r^1 .. r^count`` for ``r`` of shape ``(...)``."""
    pw = r[..., None]
    while vf.elem_shape(pw)[-1] < count:
        have = vf.elem_shape(pw)[-1]
        take = min(have, count - have)
        pw = vf.concat([pw, vf.mul(pw[..., :take], pw[..., have - 1 : have])])
    return pw


def scaled_powers(vf: type[VecField], r: Arr, scale: Arr, count: int) -> Arr:
    """``(..., count)`` array of ``scale * r^1 .. scale * r^count``."""
    pw = vf.mul(scale, r)[..., None]
    r_have = r  # r^have, have = entries so far
    while vf.elem_shape(pw)[-1] < count:
        have = vf.elem_shape(pw)[-1]
        take = min(have, count - have)
        pw = vf.concat([pw, vf.mul(pw[..., :take], r_have[..., None])])
        if have + take < count:
            r_have = vf.mul(r_have, r_have)
    return pw


class _Chunked(BatchCircuit):
    """The range check shared by SumVec, Histogram, MultihotCountVec and
    L1BoundSum (``circuits.chunked_bit_check``), vectorised over reports and
    chunks: call k multiplies ``r_k^(j+1) x_kj`` by ``x_kj - 1/S`` for each
    j in its chunk."""

    chunk_length: int

    def _chunks(self, meas: Arr) -> Arr:
        """The measurement as ``(reports, calls, chunk_length)``, zero padded."""
        vf = self.vf
        rows, length = vf.elem_shape(meas)
        calls = self.valid.GADGET_CALLS[0]
        m = self.chunk_length
        pad = calls * m - length
        x = vf.concat([meas, vf.zeros((rows, pad))]) if pad else meas
        return vf.reshape(x, (rows, calls, m))

    def _bit_check_wires(self, meas: Arr, joint_rand: Arr, num_shares: int) -> Arr:
        vf = self.vf
        rows = vf.elem_shape(meas)[0]
        m = self.chunk_length
        calls = self.valid.GADGET_CALLS[0]
        if vf is VecField128:
            # One compiled pass, the same limbs as the NumPy form below
            # (which spent a quarter of a SumVec shard on temporaries),
            # reading the measurement in place (the padding is implicit).
            out = np.empty((4, rows, calls, 2 * m), dtype=np.int64)
            kernels().bit_check_wires128(
                meas,
                np.ascontiguousarray(joint_rand),
                np.ascontiguousarray(vf.constant(pow(num_shares, -1, vf.MODULUS))),
                vf.bit_mask(meas) is not None,
                out,
            )
            return vf.moveaxis(out, -1, -2)
        x = self._chunks(meas)
        r_pows = powers(vf, joint_rand, m)  # (rows, calls, m)
        # On the prover's own encoding (all bits) select, don't multiply.
        ones = vf.bit_mask(x)
        left = vf.mul(r_pows, x) if ones is None else vf.select(ones, r_pows, vf.zeros(()))
        right = vf.sub(x, vf.constant(pow(num_shares, -1, vf.MODULUS)))
        inter = vf.stack([left, right], axis=-1)  # (rows, calls, m, 2)
        return vf.moveaxis(vf.reshape(inter, (rows, calls, 2 * m)), -1, -2)

    def _range_check(self, gadget_outputs: Sequence[Arr]) -> Arr:
        return self.vf.sum(gadget_outputs[0], axis=-1)

    @abstractmethod
    def _output(self, meas: Arr, gadget_outputs: Sequence[Arr], num_shares: int) -> Arr: ...

    def eval(
        self, meas: Arr, joint_rand: Arr, num_shares: int, gadget_outputs: Sequence[Arr] | None
    ) -> tuple[list[Arr], Arr | None]:
        wires = self._bit_check_wires(meas, joint_rand, num_shares)
        if gadget_outputs is None:
            return [wires], None
        return [wires], self._output(meas, gadget_outputs, num_shares)

    def wire_evals(
        self,
        meas: Arr,
        joint_rand: Arr,
        num_shares: int,
        gadget_outputs: Sequence[Arr],
        seeds: Sequence[Arr],
        weights: Sequence[Arr],
    ) -> tuple[list[Arr], Arr] | None:
        # With weights w_k of the query point: left wire j is
        # seed w_0 + sum_k (w_k r_k^(j+1)) x_kj, right wire j is
        # seed w_0 + sum_k w_k x_kj - (1/S) sum_k w_k. Folding the weights
        # into the powers of r saves one multiplication per entry.
        vf = self.vf
        rows = vf.elem_shape(meas)[0]
        m = self.chunk_length
        calls = self.valid.GADGET_CALLS[0]
        x = self._chunks(meas)  # (rows, calls, m)
        w = weights[0]
        w_calls = w[..., 1 : calls + 1]
        if vf is VecField128 and calls < 1 << 16:
            left = np.empty((4, rows, m), dtype=np.int64)
            right_sum = np.empty((4, rows, m), dtype=np.int64)
            kernels().chunk_wire_evals128(x, joint_rand, w_calls, left, right_sum)
        else:
            coeffs = scaled_powers(vf, joint_rand, w_calls, m)  # (rows, calls, m)
            left = vf.dot(coeffs, x, axis=-2)
            right_sum = vf.dot(x, w_calls[..., None], axis=-2)
        shares_inv = vf.constant(pow(num_shares, -1, vf.MODULUS))
        offset = vf.mul(vf.sum(w_calls, axis=-1), shares_inv)
        right = vf.sub(right_sum, offset[..., None])
        both = vf.reshape(vf.stack([left, right], axis=-1), (rows, 2 * m))
        evals = vf.add(both, vf.mul(seeds[0], w[..., 0:1]))
        return [evals], self._output(meas, gadget_outputs, num_shares)


class CountBatch(BatchCircuit):
    def encode(self, measurements: Sequence[Any]) -> Arr:
        vals = list(measurements)
        if not _all_ints_in(vals, 0, 1):
            for i, m in enumerate(measurements):
                _check_int(f"measurement {i}: Count", m, 0, 1)
        return _bits_to_field(self.vf, np.array(vals, dtype=np.uint64).reshape(-1, 1))

    def eval(
        self, meas: Arr, joint_rand: Arr, num_shares: int, gadget_outputs: Sequence[Arr] | None
    ) -> tuple[list[Arr], Arr | None]:
        x = meas[..., 0:1]
        wires = self.vf.stack([x, x], axis=-2)  # (rows, 2, 1)
        if gadget_outputs is None:
            return [wires], None
        return [wires], self.vf.sub(gadget_outputs[0], x)

    def truncate(self, meas: Arr) -> Arr:
        return meas


class SumBatch(BatchCircuit):
    valid: circuits.Sum

    def encode(self, measurements: Sequence[Any]) -> Arr:
        top = self.valid.max_measurement
        vals = list(measurements)
        if not _all_ints_in(vals, 0, top):
            for i, m in enumerate(measurements):
                _check_int(f"measurement {i}: Sum", m, 0, top)
        kind = np.int64 if top < 1 << 62 else object
        return _bits_to_field(self.vf, _range_checked_bits(np.array(vals, dtype=kind), top))

    def eval(
        self, meas: Arr, joint_rand: Arr, num_shares: int, gadget_outputs: Sequence[Arr] | None
    ) -> tuple[list[Arr], Arr | None]:
        wires = meas[..., None, :]  # (rows, 1, bits)
        return [wires], None if gadget_outputs is None else gadget_outputs[0]

    def truncate(self, meas: Arr) -> Arr:
        return self.vf.dot_consts(meas, _range_weights(self.valid.max_measurement))[..., None]


class SumVecBatch(_Chunked):
    valid: circuits.SumVec

    def __init__(self, valid: circuits.SumVec) -> None:
        super().__init__(valid)
        self.chunk_length = valid.chunk_length

    def encode(self, measurements: Sequence[Any]) -> Arr:
        v = self.valid
        rows = list(measurements)
        for i, m in enumerate(rows):
            if type(m) is not list or len(m) != v.length:  # a list of the length passes
                circuits._require_sequence(f"measurement {i}: SumVec", m, v.length)
        vals = _int64_table(rows, v.length, v.max_measurement)
        if vals is None:
            for i, m in enumerate(rows):
                if not _all_ints_in(m, 0, v.max_measurement):
                    for j, x in enumerate(m):
                        _check_int(f"measurement {i}: SumVec[{j}]", x, 0, v.max_measurement)
            kind = np.int64 if v.max_measurement < 1 << 62 else object
            vals = np.array(rows, dtype=kind).reshape(len(rows), v.length)
        bits = _range_checked_bits(vals, v.max_measurement).reshape(len(rows), -1)
        return _bits_to_field(self.vf, bits)

    def _output(self, meas: Arr, gadget_outputs: Sequence[Arr], num_shares: int) -> Arr:
        return self._range_check(gadget_outputs)[..., None]

    def truncate(self, meas: Arr) -> Arr:
        v = self.valid
        rows = self.vf.elem_shape(meas)[0]
        shaped = self.vf.reshape(meas, (rows, v.length, v.bits))
        return self.vf.dot_consts(shaped, _range_weights(v.max_measurement))


class HistogramBatch(_Chunked):
    valid: circuits.Histogram

    def __init__(self, valid: circuits.Histogram) -> None:
        super().__init__(valid)
        self.chunk_length = valid.chunk_length

    def encode(self, measurements: Sequence[Any]) -> Arr:
        length = self.valid.length
        idx = list(measurements)
        if not _all_ints_in(idx, 0, length - 1):
            for i, m in enumerate(measurements):
                _check_int(f"measurement {i}: Histogram", m, 0, length - 1)
        bits = np.zeros((len(idx), length), dtype=np.uint64)
        bits[np.arange(len(idx)), np.array(idx, dtype=np.intp)] = 1
        return _bits_to_field(self.vf, bits)

    def _output(self, meas: Arr, gadget_outputs: Sequence[Arr], num_shares: int) -> Arr:
        vf = self.vf
        sum_check = vf.sub(vf.sum(meas, axis=-1), vf.constant(pow(num_shares, -1, vf.MODULUS)))
        return vf.stack([self._range_check(gadget_outputs), sum_check], axis=-1)

    def truncate(self, meas: Arr) -> Arr:
        return meas


class MultihotCountVecBatch(_Chunked):
    valid: circuits.MultihotCountVec

    def __init__(self, valid: circuits.MultihotCountVec) -> None:
        super().__init__(valid)
        self.chunk_length = valid.chunk_length

    def _output(self, meas: Arr, gadget_outputs: Sequence[Arr], num_shares: int) -> Arr:
        vf = self.vf
        v = self.valid
        weight = vf.sum(meas[..., : v.length], axis=-1)
        reported = vf.dot_consts(meas[..., v.length :], _range_weights(v.max_weight))
        return vf.stack([self._range_check(gadget_outputs), vf.sub(weight, reported)], axis=-1)

    def truncate(self, meas: Arr) -> Arr:
        return meas[..., : self.valid.length]


class L1BoundSumBatch(_Chunked):
    """``circuits.L1BoundSum``: SumVec's bits with the claimed sum's after
    them, and the check that the entries add up to it."""

    valid: circuits.L1BoundSum

    def __init__(self, valid: circuits.L1BoundSum) -> None:
        super().__init__(valid)
        self.chunk_length = valid.chunk_length

    def encode(self, measurements: Sequence[Any]) -> Arr:
        v = self.valid
        rows = list(measurements)
        for i, m in enumerate(rows):
            if type(m) is not list or len(m) != v.length:  # a list of the length passes
                circuits._require_sequence(f"measurement {i}: L1BoundSum", m, v.length)
        vals = _int64_table(rows, v.length, v.max_value)
        if vals is None:
            for i, m in enumerate(rows):
                if not _all_ints_in(m, 0, v.max_value):
                    for j, x in enumerate(m):
                        _check_int(f"measurement {i}: L1BoundSum[{j}]", x, 0, v.max_value)
            kind = np.int64 if v.max_value < 1 << 62 else object
            vals = np.array(rows, dtype=kind).reshape(len(rows), v.length)
        # Entries of at most 2^62 each, so int64 sums can overflow: sum as
        # Python ints where they could.
        wide = v.max_value >= (1 << 62) // v.length
        totals = vals.astype(object).sum(axis=1) if wide else vals.sum(axis=1)
        over = np.flatnonzero(totals > v.max_value)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"measurement {i}: L1BoundSum measurement sums to {totals[i]}; "
                f"at most max_value={v.max_value}"
            )
        with_total = np.concatenate([vals, totals.astype(vals.dtype)[:, None]], axis=1)
        bits = _range_checked_bits(with_total, v.max_value).reshape(len(rows), -1)
        return _bits_to_field(self.vf, bits)

    def _output(self, meas: Arr, gadget_outputs: Sequence[Arr], num_shares: int) -> Arr:
        # The entries' sum minus the claimed one as one weighted sum: every
        # entry's bit weights, then the claimed sum's negated (a third of
        # the time of summing the entries' bit columns first).
        weights = _range_weights(self.valid.max_value)
        signed = weights * self.valid.length + [-w for w in weights]
        weight_check = self.vf.dot_consts(meas, signed)
        return self.vf.stack([self._range_check(gadget_outputs), weight_check], axis=-1)

    def truncate(self, meas: Arr) -> Arr:
        v = self.valid
        rows = self.vf.elem_shape(meas)[0]
        shaped = self.vf.reshape(meas[..., : v.length * v.bits], (rows, v.length, v.bits))
        return self.vf.dot_consts(shaped, _range_weights(v.max_value))


def batch_circuit(valid: circuits.Valid[Any, Any], lifted: bool = False) -> BatchCircuit:
    """The vectorised form of ``valid`` (``lifted=True`` forces the generic one)."""
    if not lifted:
        kind = type(valid)
        if kind is circuits.Count:
            return CountBatch(valid)
        if kind is circuits.Sum:
            return SumBatch(valid)
        if isinstance(valid, circuits.SumVec) and kind is circuits.SumVec:
            return SumVecBatch(valid)
        if isinstance(valid, circuits.Histogram) and kind is circuits.Histogram:
            return HistogramBatch(valid)
        if isinstance(valid, circuits.MultihotCountVec) and kind is circuits.MultihotCountVec:
            return MultihotCountVecBatch(valid)
        if isinstance(valid, circuits.L1BoundSum) and kind is circuits.L1BoundSum:
            return L1BoundSumBatch(valid)
    return LiftedCircuit(valid)

"""The fully linear proof system of BBCGGI19 (Theorem 4.3), as specified in
draft-irtf-cfrg-vdaf-18, Section 7.3: ``prove``, ``query``, ``decide``.

For each gadget called ``M`` times the prover builds one wire polynomial
per gadget input, of degree ``< P = next_power_of_2(1 + M)``: its value at
``alpha^0`` is a random seed and at ``alpha^k`` the input of the k-th call
(``alpha`` a primitive P-th root of unity). The proof holds the seeds and the
gadget polynomial ``G(x) = gadget(wires(x))`` as its first
``DEGREE * (P - 1) + 1`` values on the next power-of-two domain. The verifier
reruns the circuit taking gadget outputs from ``G(alpha^k)`` and checks, at
a random point ``t``, that ``G(t) = gadget(wires(t))``; all of ``query`` is
linear in (measurement, proof), so it runs on secret shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic

from veil.vdaf.errors import VerifyError
from veil.vdaf.spec.circuits import AggResult, Measurement, Valid
from veil.vdaf.spec.field import Field
from veil.vdaf.spec.gadgets import Gadget
from veil.vdaf.spec.poly import LagrangeEvaluator, PrefixExtension, inv_ntt, next_power_of_2, ntt


def wire_poly_len(gadget_calls: int) -> int:
    """Values per wire polynomial: the seed plus one per call, rounded up."""
    return next_power_of_2(1 + gadget_calls)


def gadget_poly_len(degree: int, wire_len: int) -> int:
    """Values of the gadget polynomial carried in the proof."""
    return degree * (wire_len - 1) + 1


@dataclass(frozen=True)
class _GadgetLayout:
    gadget: Gadget
    calls: int
    wire_len: int  # P
    poly_len: int  # values of G in the proof
    domain: int  # next_power_of_2(poly_len), where G is evaluated


class _Recorder:
    """Stands in for a gadget during circuit evaluation and records the value
    of each input wire at each call (``wires[j][k]`` is input j of call k)."""

    def __init__(self, seeds: Sequence[int], wire_len: int) -> None:
        self.wires = [[s] + [0] * (wire_len - 1) for s in seeds]
        self.calls = 0

    def record(self, inp: Sequence[int]) -> None:
        self.calls += 1
        for wire, x in zip(self.wires, inp, strict=True):
            wire[self.calls] = x


class _ProveCall(_Recorder):
    def __init__(
        self, field: type[Field], gadget: Gadget, seeds: Sequence[int], wire_len: int
    ) -> None:
        super().__init__(seeds, wire_len)
        self._field = field
        self._gadget = gadget

    def __call__(self, inp: Sequence[int]) -> int:
        self.record(inp)
        return self._gadget.eval(self._field, inp)


class _QueryCall(_Recorder):
    def __init__(self, seeds: Sequence[int], wire_len: int, outputs: Sequence[int]) -> None:
        super().__init__(seeds, wire_len)
        self._outputs = outputs  # G(alpha^k) for k = 0 .. wire_len - 1

    def __call__(self, inp: Sequence[int]) -> int:
        self.record(inp)
        return self._outputs[self.calls]


class FlpBBCGGI19(Generic[Measurement, AggResult]):
    """The FLP for a validity circuit. Lengths follow the draft's names."""

    def __init__(self, valid: Valid[Measurement, AggResult]) -> None:
        self.valid = valid
        self.field = valid.field
        self.layouts = []
        for g, calls in zip(valid.GADGETS, valid.GADGET_CALLS, strict=True):
            wire_len = wire_poly_len(calls)
            poly_len = gadget_poly_len(g.DEGREE, wire_len)
            if valid.field.GEN_ORDER % next_power_of_2(poly_len):
                raise ValueError("circuit too large for the field's roots of unity")
            self.layouts.append(
                _GadgetLayout(g, calls, wire_len, poly_len, next_power_of_2(poly_len))
            )
        self.MEAS_LEN = valid.MEAS_LEN
        self.OUTPUT_LEN = valid.OUTPUT_LEN
        self.JOINT_RAND_LEN = valid.JOINT_RAND_LEN
        self.PROVE_RAND_LEN = sum(g.ARITY for g in valid.GADGETS)
        self.QUERY_RAND_LEN = len(valid.GADGETS) + (
            valid.EVAL_OUTPUT_LEN if valid.EVAL_OUTPUT_LEN > 1 else 0
        )
        self.PROOF_LEN = sum(lay.gadget.ARITY + lay.poly_len for lay in self.layouts)
        self.VERIFIER_LEN = 1 + sum(g.ARITY + 1 for g in valid.GADGETS)
        # Built on first use: only verifiers need them.
        self._extensions: list[PrefixExtension] | None = None

    def encode(self, measurement: Measurement) -> list[int]:
        return self.valid.encode(measurement)

    def truncate(self, meas: Sequence[int]) -> list[int]:
        return self.valid.truncate(meas)

    def decode(self, output: Sequence[int], num_measurements: int) -> AggResult:
        return self.valid.decode(output, num_measurements)

    def prove(
        self, meas: Sequence[int], prove_rand: Sequence[int], joint_rand: Sequence[int]
    ) -> list[int]:
        """Pre: ``len(meas) == MEAS_LEN``, ``len(prove_rand) == PROVE_RAND_LEN``,
        ``len(joint_rand) == JOINT_RAND_LEN``. Post: ``PROOF_LEN`` elements."""
        _check_len("measurement", meas, self.MEAS_LEN)
        _check_len("prove randomness", prove_rand, self.PROVE_RAND_LEN)
        _check_len("joint randomness", joint_rand, self.JOINT_RAND_LEN)
        field = self.field
        calls: list[_ProveCall] = []
        offset = 0
        for lay in self.layouts:
            seeds = prove_rand[offset : offset + lay.gadget.ARITY]
            offset += lay.gadget.ARITY
            calls.append(_ProveCall(field, lay.gadget, seeds, lay.wire_len))
        self.valid.eval(meas, joint_rand, 1, calls)

        proof: list[int] = []
        for lay, call in zip(self.layouts, calls, strict=True):
            proof += [wire[0] for wire in call.wires]
            # Each wire's values on the larger domain where G is determined.
            wire_values = [ntt(field, inv_ntt(field, wire), lay.domain) for wire in call.wires]
            proof += lay.gadget.eval_poly(field, wire_values)[: lay.poly_len]
        return proof

    def query(
        self,
        meas: Sequence[int],
        proof: Sequence[int],
        query_rand: Sequence[int],
        joint_rand: Sequence[int],
        num_shares: int,
    ) -> list[int]:
        """Pre: lengths as in ``prove``, ``len(proof) == PROOF_LEN``,
        ``len(query_rand) == QUERY_RAND_LEN``. Post: ``VERIFIER_LEN`` elements.
        Raises ``VerifyError`` if a query point is a root of unity of the
        wire domain (the verifier message could then leak a gadget output)."""
        _check_len("measurement", meas, self.MEAS_LEN)
        _check_len("proof", proof, self.PROOF_LEN)
        _check_len("query randomness", query_rand, self.QUERY_RAND_LEN)
        _check_len("joint randomness", joint_rand, self.JOINT_RAND_LEN)
        field = self.field
        p = field.MODULUS
        if self._extensions is None:
            self._extensions = [PrefixExtension(field, lay.poly_len) for lay in self.layouts]

        calls: list[_QueryCall] = []
        gadget_polys: list[list[int]] = []
        offset = 0
        for lay, ext in zip(self.layouts, self._extensions, strict=True):
            seeds = proof[offset : offset + lay.gadget.ARITY]
            offset += lay.gadget.ARITY
            values = ext.extend(proof[offset : offset + lay.poly_len])
            offset += lay.poly_len
            step = lay.domain // lay.wire_len
            calls.append(_QueryCall(seeds, lay.wire_len, values[::step]))
            gadget_polys.append(values)

        out = self.valid.eval(meas, joint_rand, num_shares, calls)
        e = self.valid.EVAL_OUTPUT_LEN
        if e > 1:
            v = sum(r * x for r, x in zip(query_rand[:e], out, strict=True)) % p
            points = query_rand[e:]
        else:
            v = out[0]
            points = query_rand

        verifier = [v]
        for lay, call, values, t in zip(self.layouts, calls, gadget_polys, points, strict=True):
            if pow(t, lay.wire_len, p) == 1:
                raise VerifyError("query point is a root of unity; report cannot be verified")
            on_wires = LagrangeEvaluator(field, lay.wire_len, t)
            verifier += [on_wires.eval(wire) for wire in call.wires]
            verifier.append(LagrangeEvaluator(field, lay.domain, t).eval(values))
        return verifier

    def decide(self, verifier: Sequence[int]) -> bool:
        """True iff the combined verifier message accepts."""
        _check_len("verifier", verifier, self.VERIFIER_LEN)
        if verifier[0] != 0:
            return False
        offset = 1
        for g in self.valid.GADGETS:
            wire_checks = verifier[offset : offset + g.ARITY]
            gadget_check = verifier[offset + g.ARITY]
            offset += g.ARITY + 1
            if g.eval(self.field, wire_checks) != gadget_check:
                return False
        return True


def _check_len(what: str, vec: Sequence[int], expected: int) -> None:
    if len(vec) != expected:
        raise ValueError(f"{what}: expected {expected} elements, got {len(vec)}")

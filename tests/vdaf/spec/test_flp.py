"""Every circuit with valid and invalid encoded measurements through the
FLP: an honest prover on a valid input is accepted (also when verified on
secret shares); on an invalid input ``decide`` rejects."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from veil.vdaf import Field, Field64, Field128
from veil.vdaf.spec.circuits import (
    Count,
    Histogram,
    MultihotCountVec,
    Sum,
    SumVec,
    Valid,
    encode_range_checked_int,
)
from veil.vdaf.spec.flp import FlpBBCGGI19


def rand_vec(rng: random.Random, field: type[Field], n: int) -> list[int]:
    return [rng.randrange(field.MODULUS) for _ in range(n)]


def share(rng: random.Random, field: type[Field], vec: Sequence[int], n: int) -> list[list[int]]:
    shares = [rand_vec(rng, field, len(vec)) for _ in range(n - 1)]
    last = list(vec)
    for s in shares:
        last = field.vec_sub(last, s)
    return [*shares, last]


def run_flp(flp: FlpBBCGGI19[Any, Any], meas: list[int], num_shares: int, seed: int) -> bool:
    rng = random.Random(seed)
    field = flp.field
    joint_rand = rand_vec(rng, field, flp.JOINT_RAND_LEN)
    prove_rand = rand_vec(rng, field, flp.PROVE_RAND_LEN)
    query_rand = rand_vec(rng, field, flp.QUERY_RAND_LEN)
    proof = flp.prove(meas, prove_rand, joint_rand)
    assert len(proof) == flp.PROOF_LEN
    verifier = field.zeros(flp.VERIFIER_LEN)
    for m, pf in zip(
        share(rng, field, meas, num_shares), share(rng, field, proof, num_shares), strict=True
    ):
        verifier = field.vec_add(verifier, flp.query(m, pf, query_rand, joint_rand, num_shares))
    return flp.decide(verifier)


def invalid_cases() -> list[tuple[str, Valid[Any, Any], list[int]]]:
    p64 = Field64.MODULUS
    hist = Histogram(Field128, 7, 3)
    multi = MultihotCountVec(Field128, 6, 2, 2)
    sumvec = SumVec(Field128, 3, 5, 2)
    return [
        ("count=2", Count(Field64), [2]),
        ("count=-1", Count(Field64), [p64 - 1]),
        ("sum bit=2", Sum(Field64, 100), [2, 0, 0, 0, 0, 0, 0]),
        ("histogram two-hot", hist, [1, 1, 0, 0, 0, 0, 0]),
        ("histogram all-zero", hist, [0] * 7),
        ("histogram entry=2 sum=1", hist, [2, 0, 0, 0, 0, Field128.MODULUS - 1, 0]),
        (
            "multihot weight lie",
            multi,
            [1, 1, 1, 0, 0, 0, *encode_range_checked_int(Field128, 2, 2)],
        ),
        ("multihot non-bit", multi, [2, 0, 0, 0, 0, 0, *encode_range_checked_int(Field128, 2, 2)]),
        ("sumvec non-bit", sumvec, [0, 0, 3, 0, 0, 0, 0, 0, 0]),
    ]


def valid_cases() -> list[tuple[str, Valid[Any, Any], Any]]:
    return [
        ("count 0", Count(Field64), 0),
        ("count 1", Count(Field64), 1),
        ("sum 0", Sum(Field64, 100), 0),
        ("sum max", Sum(Field64, 100), 100),
        ("sum 63", Sum(Field64, 100), 63),
        ("sum 2^32-1", Sum(Field64, 2**32 - 1), 2**32 - 1),
        ("histogram first", Histogram(Field128, 7, 3), 0),
        ("histogram last", Histogram(Field128, 7, 3), 6),
        ("multihot", MultihotCountVec(Field128, 6, 2, 2), [True, False, False, False, False, True]),
        ("multihot none", MultihotCountVec(Field128, 6, 2, 2), [False] * 6),
        ("sumvec", SumVec(Field128, 3, 5, 2), [5, 0, 3]),
        ("sumvec chunk 1", SumVec(Field64, 2, 1, 1), [1, 0]),
    ]


@pytest.mark.parametrize(("name", "valid", "measurement"), valid_cases())
@pytest.mark.parametrize("num_shares", [1, 2, 3])
def test_valid_measurements_accepted(
    name: str, valid: Valid[Any, Any], measurement: Any, num_shares: int
) -> None:
    flp = FlpBBCGGI19(valid)
    meas = flp.encode(measurement)
    assert valid.eval_direct(meas, [1] * valid.JOINT_RAND_LEN) == [0] * valid.EVAL_OUTPUT_LEN
    for seed in range(3):
        assert run_flp(flp, meas, num_shares, seed), name


@pytest.mark.parametrize(("name", "valid", "meas"), invalid_cases())
@pytest.mark.parametrize("num_shares", [1, 2])
def test_invalid_measurements_rejected(
    name: str, valid: Valid[Any, Any], meas: list[int], num_shares: int
) -> None:
    flp = FlpBBCGGI19(valid)
    assert len(meas) == flp.MEAS_LEN
    for seed in range(3):
        assert not run_flp(flp, meas, num_shares, seed), name


def test_tampered_proof_rejected() -> None:
    flp = FlpBBCGGI19(Histogram(Field128, 5, 2))
    rng = random.Random(7)
    meas = flp.encode(3)
    joint_rand = rand_vec(rng, flp.field, flp.JOINT_RAND_LEN)
    proof = flp.prove(meas, rand_vec(rng, flp.field, flp.PROVE_RAND_LEN), joint_rand)
    query_rand = rand_vec(rng, flp.field, flp.QUERY_RAND_LEN)
    assert flp.decide(flp.query(meas, proof, query_rand, joint_rand, 1))
    for i in range(len(proof)):
        bad = list(proof)
        bad[i] = (bad[i] + 1) % flp.field.MODULUS
        assert not flp.decide(flp.query(meas, bad, query_rand, joint_rand, 1)), i

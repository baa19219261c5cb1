"""The batched FLP's extension of wire polynomials (veil.vdaf.batch.flp,
``_Extension``): every path (NTT, fixed-matrix and small-integer GEMM,
sparse) and the prover's fused passes against the scalar NTT and gadget."""

from __future__ import annotations

import random

import pytest

from veil.vdaf import Field128
from veil.vdaf.batch.circuits import gadget_eval
from veil.vdaf.batch.field import VecField128
from veil.vdaf.batch.flp import _Extension
from veil.vdaf.spec.gadgets import Mul, ParallelSum
from veil.vdaf.spec.poly import inv_ntt, ntt


@pytest.mark.parametrize("wire_len,domain", [(4, 8), (16, 32), (64, 128), (4, 16)])
@pytest.mark.parametrize("kind", ["dense", "small", "sparse"])
def test_extension_paths_match_ntt(wire_len: int, domain: int, kind: str) -> None:
    """Every way ``_Extension`` extends wire polynomials (NTT, fixed-matrix
    GEMM, small-integer GEMM, sparse) agrees with the scalar NTT."""
    p = Field128.MODULUS
    rng = random.Random(f"{wire_len}-{domain}-{kind}")
    rows = []
    for _ in range(5):
        row = [rng.randrange(p)]
        for _ in range(wire_len - 1):
            if kind == "dense":
                row.append(rng.randrange(p))
            elif kind == "small":
                row.append(rng.choice([0, 1, p - 1, 7, p - 300]))
            else:
                row.append(rng.randrange(p) if rng.random() < 0.1 else 0)
        rows.append(row)
    got = VecField128.to_ints(
        _Extension(VecField128, wire_len, domain)(VecField128.from_ints(rows))
    )
    want = [ntt(Field128, inv_ntt(Field128, row), domain) for row in rows]
    assert got == want


@pytest.mark.parametrize(
    "wire_len,domain,calls", [(4, 8, 3), (16, 32, 9), (32, 64, 31), (4, 16, 2)]
)
def test_extension_of_wires_matches_built_polys(wire_len: int, domain: int, calls: int) -> None:
    """The prover's one-pass extension (seed, wire values, zeros: the
    kernel extend128) gives the values of extending the polynomials built
    as arrays, on every coset."""
    p = Field128.MODULUS
    rng = random.Random(f"{wire_len}-{domain}-{calls}")
    rows, arity = 3, 2

    def value() -> int:
        return rng.choice([0, 1, p - 1, 5, p - 300, rng.randrange(p), rng.randrange(p)])

    seeds = [[rng.randrange(p) for _ in range(arity)] for _ in range(rows)]
    wires = [[[value() for _ in range(calls)] for _ in range(arity)] for _ in range(rows)]
    ext = _Extension(VecField128, wire_len, domain)
    # The circuit's wires come with the calls axis outermost (strided).
    by_call = [[[wires[r][a][c] for a in range(arity)] for c in range(calls)] for r in range(rows)]
    strided = VecField128.moveaxis(VecField128.from_ints(by_call), -1, -2)
    got = ext.of_wires(VecField128.from_ints(seeds), strided)
    assert got is not None
    polys = [
        [[seeds[r][a], *wires[r][a]] + [0] * (wire_len - 1 - calls) for a in range(arity)]
        for r in range(rows)
    ]
    want = VecField128.to_ints(ext(VecField128.from_ints(polys)))
    assert VecField128.to_ints(got) == want


@pytest.mark.parametrize(
    "wire_len,domain,calls,count", [(4, 8, 3, 1), (16, 32, 9, 10), (32, 64, 27, 30), (4, 16, 2, 2)]
)
def test_mul_sum_of_wires_matches_the_gadget_on_the_domain(
    wire_len: int, domain: int, calls: int, count: int
) -> None:
    """The prover's fused ParallelSum(Mul) pass (the kernel
    prove_mul_sum128) gives the gadget's polynomial evaluated point by point
    on the extended wires, for dense, small, zero and -1 values."""
    p = Field128.MODULUS
    rng = random.Random(f"mul-sum-{wire_len}-{domain}-{calls}")
    rows, arity = 3, 2 * count
    poly_len = 2 * (wire_len - 1) + 1

    def value() -> int:
        return rng.choice([0, 0, 1, p - 1, 5, p - 300, rng.randrange(p), rng.randrange(p)])

    seeds = VecField128.from_ints([[rng.randrange(p) for _ in range(arity)] for _ in range(rows)])
    by_call = [[[value() for _ in range(arity)] for _ in range(calls)] for _ in range(rows)]
    wires = VecField128.moveaxis(VecField128.from_ints(by_call), -1, -2)
    ext = _Extension(VecField128, wire_len, domain)
    got = ext.mul_sum_of_wires(seeds, wires, poly_len)
    assert got is not None and got.shape == (4, rows, poly_len)
    on_domain = ext.of_wires(seeds, wires)
    assert on_domain is not None
    want = gadget_eval(VecField128, ParallelSum(Mul(), count), on_domain)[..., :poly_len]
    assert VecField128.to_ints(got) == VecField128.to_ints(want)

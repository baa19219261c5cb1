"""Gadgets of the BBCGGI19 FLP (draft-irtf-cfrg-vdaf-18, Section 7.3.4).

A gadget is the non-affine piece of a validity circuit: an arithmetic
function of ``ARITY`` inputs and degree ``DEGREE``. The proof system only
needs to evaluate a gadget on field elements; because polynomials are kept
in the Lagrange basis, evaluating a gadget on polynomials is evaluating it
point by point on their values (``eval_poly``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from veil.vdaf.spec.field import Field


class Gadget(ABC):
    ARITY: int
    DEGREE: int

    @abstractmethod
    def eval(self, field: type[Field], inp: Sequence[int]) -> int:
        """Evaluate on ``ARITY`` reduced field elements."""

    def eval_poly(self, field: type[Field], inp_polys: Sequence[Sequence[int]]) -> list[int]:
        """Evaluate on ``ARITY`` polynomials given by their values on a common
        domain with more than ``DEGREE * (deg(inputs))`` points; the result is
        the composed polynomial's values on that domain."""
        if len(inp_polys) != self.ARITY:
            raise ValueError(f"expected {self.ARITY} input polynomials, got {len(inp_polys)}")
        return [self.eval(field, column) for column in zip(*inp_polys, strict=True)]


class Mul(Gadget):
    """x * y."""

    ARITY = 2
    DEGREE = 2

    def eval(self, field: type[Field], inp: Sequence[int]) -> int:
        return inp[0] * inp[1] % field.MODULUS


class PolyEval(Gadget):
    """A fixed univariate polynomial, coefficients lowest degree first
    (negative coefficients are reduced in the field)."""

    ARITY = 1

    def __init__(self, coeffs: Sequence[int]) -> None:
        stripped = list(coeffs)
        while stripped and stripped[-1] == 0:
            stripped.pop()
        if not stripped:
            raise ValueError("PolyEval needs a non-zero polynomial")
        self.coeffs = stripped
        self.DEGREE = len(stripped) - 1

    def eval(self, field: type[Field], inp: Sequence[int]) -> int:
        p = field.MODULUS
        x = inp[0]
        acc = 0
        for c in reversed(self.coeffs):
            acc = (acc * x + c) % p
        return acc


class ParallelSum(Gadget):
    """Sum of ``count`` evaluations of ``subcircuit`` on consecutive slices
    of the input (BBCGGI19, Section 4.4): fewer gadget calls, shorter proofs."""

    def __init__(self, subcircuit: Gadget, count: int) -> None:
        if count < 1:
            raise ValueError("ParallelSum count must be at least 1")
        self.subcircuit = subcircuit
        self.count = count
        self.ARITY = subcircuit.ARITY * count
        self.DEGREE = subcircuit.DEGREE

    def eval(self, field: type[Field], inp: Sequence[int]) -> int:
        arity = self.subcircuit.ARITY
        total = 0
        for i in range(0, self.ARITY, arity):
            total += self.subcircuit.eval(field, inp[i : i + arity])
        return total % field.MODULUS

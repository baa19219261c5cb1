"""Polynomials over NTT-friendly fields, in the Lagrange basis.

The FLP of draft-irtf-cfrg-vdaf-18 (Section 7.3) represents every
polynomial by its values at successive powers of a primitive n-th root of
unity ``w`` (``w = Field.root_of_unity(n)``): ``[P(w^0), P(w^1), ...]``.
These helpers move between that basis and coefficients (the NTT), evaluate
such a polynomial at an arbitrary point, and extend a prefix of values to a
full power-of-two domain. All vectors are ``list[int]`` of reduced elements.
"""

from __future__ import annotations

from collections.abc import Sequence

from veil.vdaf.spec.field import Field


def next_power_of_2(n: int) -> int:
    """The smallest power of two that is ``>= n`` (``n >= 1``)."""
    return 1 << (n - 1).bit_length()


def ntt(field: type[Field], coeffs: Sequence[int], n: int) -> list[int]:
    """``[P(w^i) for i in range(n)]`` for ``P`` with the given coefficients
    (at most ``n`` of them), ``w`` the field's primitive n-th root."""
    if len(coeffs) > n:
        raise ValueError(f"{len(coeffs)} coefficients do not fit a size-{n} NTT")
    p = field.MODULUS
    a = list(coeffs) + [0] * (n - len(coeffs))
    # Bit-reversal permutation, then iterative Cooley-Tukey butterflies.
    j = 0
    for i in range(1, n):
        bit = n >> 1
        while j & bit:
            j ^= bit
            bit >>= 1
        j |= bit
        if i < j:
            a[i], a[j] = a[j], a[i]
    size = 2
    while size <= n:
        half = size >> 1
        w_size = field.root_of_unity(size)
        twiddles = [1] * half
        for k in range(1, half):
            twiddles[k] = twiddles[k - 1] * w_size % p
        for start in range(0, n, size):
            for k in range(half):
                u = a[start + k]
                v = a[start + k + half] * twiddles[k] % p
                a[start + k] = (u + v) % p
                a[start + k + half] = (u - v) % p
        size <<= 1
    return a


def inv_ntt(field: type[Field], values: Sequence[int]) -> list[int]:
    """Coefficients of the polynomial of degree ``< n`` taking ``values``
    at the n-th roots of unity (``n = len(values)``, a power of two)."""
    n = len(values)
    p = field.MODULUS
    out = ntt(field, values, n)
    n_inv = pow(n, -1, p)
    # Evaluating at w^-i is evaluating at w^(n-i): reverse all but the first.
    return [out[0] * n_inv % p] + [x * n_inv % p for x in reversed(out[1:])]


def batch_inverse(field: type[Field], xs: Sequence[int]) -> list[int]:
    """Inverses of non-zero elements with a single modular inversion
    (Montgomery's trick)."""
    p = field.MODULUS
    prefix = [1] * (len(xs) + 1)
    for i, x in enumerate(xs):
        prefix[i + 1] = prefix[i] * x % p
    acc = pow(prefix[-1], -1, p)
    out = [0] * len(xs)
    for i in range(len(xs) - 1, -1, -1):
        out[i] = acc * prefix[i] % p
        acc = acc * xs[i] % p
    return out


class LagrangeEvaluator:
    """Evaluates polynomials given by their values at the n-th roots of
    unity at a point ``t``, with the barycentric formula

        P(t) = (t^n - 1) / n * sum_i P(w^i) * w^i / (t - w^i).

    The per-point weights are computed once and shared by every polynomial
    of that size evaluated at ``t`` (all wires of a gadget, for example).
    """

    def __init__(self, field: type[Field], n: int, t: int) -> None:
        p = field.MODULUS
        w = field.root_of_unity(n)
        nodes = [1] * n
        for i in range(1, n):
            nodes[i] = nodes[i - 1] * w % p
        self._p = p
        t %= p
        if pow(t, n, p) == 1:
            # t is itself a node: the polynomial's value there is given.
            self._node_index: int | None = nodes.index(t)
            self._weights: list[int] = []
            return
        self._node_index = None
        scale = (pow(t, n, p) - 1) * pow(n, -1, p) % p
        inverses = batch_inverse(field, [(t - x) % p for x in nodes])
        self._weights = [scale * x % p * inv % p for x, inv in zip(nodes, inverses, strict=True)]

    def eval(self, values: Sequence[int]) -> int:
        if self._node_index is not None:
            return values[self._node_index]
        return sum(v * c for v, c in zip(values, self._weights, strict=True)) % self._p


class PrefixExtension:
    """Extends the values of a polynomial of degree ``< length`` at the first
    ``length`` powers of the n-th root of unity (``n = next_power_of_2(length)``)
    to all n powers. The map is linear; its matrix is computed once."""

    def __init__(self, field: type[Field], length: int) -> None:
        p = field.MODULUS
        n = next_power_of_2(length)
        w = field.root_of_unity(n)
        nodes = [1] * n
        for i in range(1, n):
            nodes[i] = nodes[i - 1] * w % p
        self.length = length
        self.n = n
        self._p = p
        known = nodes[:length]
        # Lagrange basis over the known nodes, evaluated at each missing node:
        # l_i(x) = prod_{j != i} (x - x_j) / (x_i - x_j).
        denominators = []
        for i, xi in enumerate(known):
            d = 1
            for j, xj in enumerate(known):
                if j != i:
                    d = d * (xi - xj) % p
            denominators.append(d)
        den_inv = batch_inverse(field, denominators)
        rows: list[list[int]] = []
        for x in nodes[length:]:
            full = 1
            for xj in known:
                full = full * (x - xj) % p
            diff_inv = batch_inverse(field, [(x - xi) % p for xi in known])
            rows.append([full * di % p * ci % p for di, ci in zip(diff_inv, den_inv, strict=True)])
        self._rows = rows

    def extend(self, values: Sequence[int]) -> list[int]:
        if len(values) != self.length:
            raise ValueError(f"expected {self.length} values, got {len(values)}")
        p = self._p
        return list(values) + [
            sum(v * c for v, c in zip(values, row, strict=True)) % p for row in self._rows
        ]

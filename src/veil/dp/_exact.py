"""Exact random primitives: uniform integers, Bernoulli(p) and Bernoulli(exp(-γ)).

Everything here consumes only uniformly random bits (`getrandbits`) and does integer
or `Fraction` arithmetic, never floating point. Floating-point samplers leak through
the pattern of representable values (Mironov 2012, "On significance of the least
significant bits for differential privacy"); exact samplers cannot.

The scalar functions follow Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for
Differential Privacy", arXiv:2004.00010) Algorithm 1 literally and are the reference.
The `*_vec` functions run the same algorithm on many lanes at once with NumPy int64
arithmetic; each lane consumes its own fresh random bits, so lanes are independent
and each is distributed exactly as the scalar algorithm.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Protocol

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
ObjArray = npt.NDArray[np.object_]
BoolArray = npt.NDArray[np.bool_]

# Bounds handed to the int64 lanes stay below this, so no product can overflow.
INT64_SAFE = 1 << 62


class RandomSource(Protocol):
    """What veil.dp needs from an rng: uniformly random bits.

    `random.Random` (seeded, for tests) and `secrets.SystemRandom` (the default) both
    qualify; `getrandbits(k)` returns an int uniform on [0, 2**k).
    """

    def getrandbits(self, k: int, /) -> int:
        """An int uniform on [0, 2**k)."""
        ...


def randbelow(rng: RandomSource, m: int) -> int:
    """Uniform integer on [0, m), by rejection on bit strings (exact for any m >= 1)."""
    if m < 1:
        raise ValueError(f"randbelow needs m >= 1, got {m}")
    k = (m - 1).bit_length()
    while True:
        r = rng.getrandbits(k) if k else 0
        if r < m:
            return r


def bernoulli(p: Fraction, rng: RandomSource) -> bool:
    """Bernoulli(p) for a rational p in [0, 1]."""
    return randbelow(rng, p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: RandomSource) -> bool:
    """Bernoulli(exp(-gamma)) for a rational gamma >= 0 (CKS20 Algorithm 1)."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0, got {gamma}")
    # exp(-gamma) = exp(-1)**floor(gamma) * exp(-frac(gamma)): independent trials.
    whole = gamma.numerator // gamma.denominator
    for _ in range(whole):
        if not _bernoulli_exp_unit(Fraction(1), rng):
            return False
    return _bernoulli_exp_unit(gamma - whole, rng)


def _bernoulli_exp_unit(gamma: Fraction, rng: RandomSource, k: int = 1) -> bool:
    """Bernoulli(exp(-gamma)) for gamma in [0, 1], optionally resumed at counter k.

    The counter K is the first index with A_K = 0 where A_k ~ Bernoulli(gamma / k);
    P(K > k) = gamma**k / k!, so P(K odd) = exp(-gamma).
    """
    while bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def random_words(rng: RandomSource, n: int) -> npt.NDArray[np.uint64]:
    """n independent uniform 64-bit words."""
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    raw = rng.getrandbits(64 * n).to_bytes(8 * n, "little")
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def uniform_below_vec(rng: RandomSource, m: int, size: int) -> IntArray:
    """`size` independent uniform integers on [0, m), m <= 2**62, by rejection."""
    if not 1 <= m <= INT64_SAFE:
        raise ValueError(f"uniform_below_vec needs 1 <= m <= 2**62, got {m}")
    out = np.zeros(size, dtype=np.int64)
    if m == 1 or size == 0:
        return out
    shift = np.uint64(64 - (m - 1).bit_length())
    todo = np.arange(size)
    while todo.size:
        # Top bits of each word: a uniform k-bit integer; accept it if below m
        # (probability > 1/2), otherwise draw that lane again.
        r = (random_words(rng, todo.size) >> shift).astype(np.int64)
        ok = r < m
        out[todo[ok]] = r[ok]
        todo = todo[~ok]
    return out


def bernoulli_exp_vec(num: IntArray | ObjArray, den: int, rng: RandomSource) -> BoolArray:
    """Lane-wise Bernoulli(exp(-num[i] / den)) for 0 <= num[i] <= den (CKS20 Alg. 1).

    `num` may be int64 or, for numbers beyond 64 bits, a NumPy object array of ints.
    """
    result = np.zeros(num.size, dtype=np.bool_)
    alive = np.arange(num.size)
    k = 1
    while alive.size:
        bound = den * k
        # A_k ~ Bernoulli(gamma / k) = Bernoulli(num / (den * k)).
        if bound <= INT64_SAFE and num.dtype != object:
            a = uniform_below_vec(rng, bound, alive.size) < num[alive]
        else:
            a = bernoulli_ratio_vec(num[alive], bound, rng)
        stopped = alive[~a]
        result[stopped] = k % 2 == 1
        alive = alive[a]
        k += 1
    return result


def bernoulli_ratio_vec(num: IntArray | ObjArray, den: int, rng: RandomSource) -> BoolArray:
    """Lane-wise Bernoulli(num[i] / den) for integers 0 <= num[i] <= den of any size.

    Each lane compares a uniform real U with num/den. U's first 62 bits u decide the
    comparison unless u = floor(2**62 · num/den) (probability 2**-62 per lane); such
    lanes reveal more bits of U until decided. The arithmetic is on Python ints in
    NumPy object arrays, so no size limit applies.
    """
    u = (random_words(rng, num.size) >> np.uint64(2)).astype(object)
    scaled = num.astype(object) * (1 << 62)
    floor_t = scaled // den
    ceil_t = -((-scaled) // den)
    yes = np.asarray(u + 1 <= floor_t, dtype=np.bool_)  # U < (u+1)/2**62 <= num/den
    no = np.asarray(u >= ceil_t, dtype=np.bool_)  # U >= u/2**62 >= num/den
    result = yes
    for i in np.flatnonzero(~(yes | no)).tolist():
        result[i] = _refine_ratio(int(u[i]), 62, int(num[i]), den, rng)
    return result


def _refine_ratio(u: int, bits: int, num: int, den: int, rng: RandomSource) -> bool:
    """Decide U < num/den where U's first `bits` bits are u, drawing more as needed."""
    while True:
        u = (u << 32) | rng.getrandbits(32)
        bits += 32
        scaled = num << bits
        if u + 1 <= scaled // den:
            return True
        if u >= -((-scaled) // den):
            return False


def bernoulli_exp_one_vec(size: int, rng: RandomSource) -> BoolArray:
    """`size` independent Bernoulli(exp(-1)) draws."""
    return bernoulli_exp_vec(np.ones(size, dtype=np.int64), 1, rng)


@functools.lru_cache(maxsize=256)
def exp_neg_bounds(x: Fraction, bits: int) -> tuple[int, int]:
    """Integers (lo, hi) with lo <= 2**bits * exp(-x) <= hi, for a rational x >= 0.

    The Taylor series of exp(x) has positive terms, so a partial sum S is a lower
    bound and S plus a geometric bound on the remainder is an upper bound; the bounds
    on exp(-x) are their reciprocals, rounded outwards.
    """
    if x < 0:
        raise ValueError(f"exp_neg_bounds needs x >= 0, got {x}")
    target = Fraction(1, 1 << (bits + 8))
    partial = Fraction(0)
    term = Fraction(1)
    n = 0
    while True:
        partial += term
        n += 1
        term = term * x / n  # x**n / n!
        if n + 1 > 2 * x:
            # Remaining terms shrink by x/(n+1) <= 1/2 each: sum <= term / (1 - x/(n+1)).
            remainder = term / (1 - x / (n + 1))
            if remainder <= target * partial:
                break
    scale = 1 << bits
    upper_exp = partial + remainder
    lo = (scale * upper_exp.denominator) // upper_exp.numerator
    hi = -((-scale * partial.denominator) // partial.numerator)
    return lo, hi


def iroot(x: int, n: int) -> int:
    """floor(x ** (1/n)) for integers x >= 0, n >= 1, exactly."""
    if x < 0 or n < 1:
        raise ValueError("iroot needs x >= 0 and n >= 1")
    if n == 1 or x < 2:
        return x
    if n == 2:
        return math.isqrt(x)
    # Newton's iteration from above converges monotonically to the floor.
    r = 1 << -(-x.bit_length() // n)
    while True:
        nxt = ((n - 1) * r + x // r ** (n - 1)) // n
        if nxt >= r:
            break
        r = nxt
    while r**n > x:
        r -= 1
    while (r + 1) ** n <= x:
        r += 1
    return r

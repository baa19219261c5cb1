"""Where a task's noised aggregate can lie, and when its sum would wrap around.

Every coordinate of a batch's true aggregate lies in [0, n · m] for n reports
each at most m in that coordinate (the VDAF's validity circuit guarantees it);
the total noise lies in [-B, B] except with probability below NOISE_TAIL. The
collector decodes a field element by its centred lift, which is the right
integer only for values in [-(p - 1)/2, (p - 1)/2]. So a batch decodes
correctly while n · m + B <= (p - 1)/2: that fixes the largest batch a task may
release (`max_batch_size`), which both aggregators enforce, and a decoded
value outside [-B, n · m + B] is flagged by the collector (it can only come
from a wrapped sum, a misbehaving aggregator, or noise beyond B).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from veil.dp.errors import InvalidParameter
from veil.dp.mechanisms import NoisePlan

# P(|Z| > B): the noise bound B is exceeded about once in 10**12 collections.
NOISE_TAIL = 1e-12


def noise_bound(plan: NoisePlan) -> int:
    """The least B with P(|Z| <= B) >= 1 - NOISE_TAIL for the total noise Z (0 without)."""
    noise = plan.total_noise()
    if not noise.parts:
        return 0
    target = 1 - NOISE_TAIL
    lo, hi = -1, 1
    while noise.central_mass(hi) < target:
        lo, hi = hi, 2 * hi
        if hi > 1 << 400:  # pragma: no cover - central_mass would have to be broken
            raise InvalidParameter("the noise bound does not converge")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if noise.central_mass(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class AggregateBounds:
    """A task's public bounds: `report_max` is the most one report adds to a
    coordinate, `noise` the bound B on the total noise, `modulus` the field's p."""

    report_max: int
    noise: int
    modulus: int

    @property
    def max_batch_size(self) -> int:
        """The most reports a batch may hold and still decode correctly (0: none)."""
        room = (self.modulus - 1) // 2 - self.noise
        if room < 0:
            return 0
        return room // self.report_max

    def check_batch_floor(self, min_batch_size: int) -> None:
        """InvalidParameter if even a batch of min_batch_size reports could wrap."""
        if self.max_batch_size < min_batch_size:
            raise InvalidParameter(
                f"a batch of {min_batch_size} reports (min_batch_size), each up to"
                f" {self.report_max}, plus noise up to {self.noise}, would wrap around the"
                f" field (at most {self.max_batch_size} reports fit): lower max_measurement"
                " or raise epsilon"
            )

    def plausible(self, report_count: int) -> tuple[int, int]:
        """[-B, n · m + B]: where every decoded coordinate of a batch of n lies."""
        return -self.noise, report_count * self.report_max + self.noise

    def out_of_range(self, values: Sequence[int], report_count: int) -> list[int]:
        """Indices of decoded values outside `plausible(report_count)`."""
        low, high = self.plausible(report_count)
        return [i for i, v in enumerate(values) if not low <= v <= high]

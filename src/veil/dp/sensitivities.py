"""How far one report can move a Prio3 type's aggregate: its sensitivity, by the
draft's name of the type and its parameters (veil.vdaf.registry), in the shape the
noise plans need (veil.dp.mechanisms): how many coordinates, by how much each,
and, for an L1-bounded type, by how much in all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from veil.dp.errors import InvalidParameter, InvalidSensitivity
from veil.vdaf import registry

__all__ = ["VDAF_TYPES", "Sensitivity", "sensitivity"]


@dataclass(frozen=True)
class Sensitivity:
    """How far one report can move the aggregate, under replacement of one report.

    At most `coordinates` coordinates change, each by at most `per_coordinate`,
    and, where `total` is set, by at most `total` summed over all of them (an L1
    ball, as for Prio3L1BoundSum). Without `total` the L1 sensitivity is
    coordinates · per_coordinate and the squared L2 sensitivity coordinates ·
    per_coordinate². Keeping the shape (not just L1) lets the split mode compute
    the per-server ε exactly for each type.
    """

    coordinates: int
    per_coordinate: int
    total: int | None = None

    @property
    def l1(self) -> int:
        """Δ₁, which sets the discrete Laplace scale Δ₁/ε."""
        full = self.coordinates * self.per_coordinate
        return full if self.total is None else min(full, self.total)

    @property
    def l2_squared(self) -> int:
        """Δ₂², which sets the discrete Gaussian σ² = Δ₂²/(2ρ).

        Under a `total`, the largest Σ δᵢ² fills whole coordinates first (a convex
        function is largest at a vertex): ⌊total / per_coordinate⌋ of them to
        per_coordinate and one more to the rest."""
        if self.total is None or self.total >= self.coordinates * self.per_coordinate:
            return self.coordinates * self.per_coordinate**2
        whole, rest = divmod(self.total, self.per_coordinate)
        return whole * self.per_coordinate**2 + rest**2

    def shifts(self) -> dict[int, int]:
        """The worst change for a loss L that is concave in the shift with L(0) = 0 (the
        split mode's, see `NoisePlan.server_epsilon`): {shift: how many coordinates}.

        Without `total` (or with a total no smaller than the whole): every coordinate
        by per_coordinate. Under a smaller total, spread as evenly as it goes over as
        many coordinates as it reaches, a concave sum being largest at the most even
        split (Karamata)."""
        if self.total is None or self.total >= self.coordinates * self.per_coordinate:
            return {self.per_coordinate: self.coordinates}
        reached = min(self.coordinates, self.total)
        base, more = divmod(self.total, reached)
        return {k: n for k, n in ((base + 1, more), (base, reached - more)) if n}


_SUMVEC_NAMES = ("Prio3SumVec", "Prio3SumVecField64MultiproofHmacSha256Aes128")
# The draft's names of the types veil runs (veil.vdaf.registry), and the
# multiproof SumVec variant, which has the same sensitivity.
VDAF_TYPES = tuple(dict.fromkeys((*(k.prio3 for k in registry.KINDS.values()), *_SUMVEC_NAMES)))


def _param(vdaf: str, params: Mapping[str, int], name: str) -> int:
    if name not in params:
        raise InvalidSensitivity(f"{vdaf} needs the parameter {name!r} to derive its sensitivity")
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSensitivity(f"{vdaf} parameter {name} must be an int >= 1, got {value!r}")
    return value


def sensitivity(
    vdaf: str, params: Mapping[str, int], neighbouring: str = "replace_one"
) -> Sensitivity:
    """The sensitivity of a Prio3 type's aggregate when one report changes.

    `neighbouring` "replace_one" (default): one valid report replaced by another, as
    below. "add_remove": one valid report added or removed, so every bound is what a
    single valid report can contribute: Count 1, Sum max_measurement, SumVec length ·
    max_measurement, Histogram 1 (one bucket), MultihotCountVec min(max_weight,
    length) coordinates by 1.

    Under replacement:

    - Prio3Count: a 0 becomes a 1: one coordinate by 1 (Δ₁ = 1).
    - Prio3Sum(max_measurement): 0 becomes max_measurement (Δ₁ = max_measurement).
    - Prio3SumVec(length, max_measurement): every coordinate can go from 0 to
      max_measurement (Δ₁ = length · max_measurement). Drafts that give `bits`
      instead mean max_measurement = 2**bits - 1. Also the multiproof variant.
    - Prio3Histogram(length): a 1 moves from one bucket to another: two coordinates
      by 1 (Δ₁ = 2; 1 when length is 1).
    - Prio3MultihotCountVec(length, max_weight): up to max_weight ones turn off and
      as many others turn on: Δ₁ = min(2 · max_weight, length), each by 1.
    - Prio3L1BoundSum(length, max_value): non-negative entries summing to at most
      max_value become others of the same bound: each coordinate moves by at most
      max_value and all of them by at most 2 · max_value (max_value when length is
      1): Δ₁ = 2 · max_value, Δ₂² = 2 · max_value² (one entry of max_value moved
      to another). Added or removed: max_value in all.

    `chunk_length` and other parameters do not affect the sensitivity.
    """
    if neighbouring not in ("replace_one", "add_remove"):
        raise InvalidParameter(
            f"neighbouring must be replace_one or add_remove, got {neighbouring!r}"
        )
    if neighbouring == "add_remove":
        if vdaf == "Prio3Histogram":
            _param(vdaf, params, "length")
            return Sensitivity(1, 1)
        if vdaf == "Prio3MultihotCountVec":
            replaced = sensitivity(vdaf, params)
            weight = _param(vdaf, params, "max_weight")
            return Sensitivity(min(weight, replaced.coordinates), 1)
        if vdaf == "Prio3L1BoundSum":
            replaced = sensitivity(vdaf, params)
            return Sensitivity(
                replaced.coordinates, replaced.per_coordinate, replaced.per_coordinate
            )
        # Count, Sum, SumVec: one report already moves each coordinate from 0 at most.
        return sensitivity(vdaf, params)
    if vdaf == "Prio3Count":
        return Sensitivity(1, 1)
    if vdaf == "Prio3Sum":
        return Sensitivity(1, _param(vdaf, params, "max_measurement"))
    if vdaf in _SUMVEC_NAMES:
        length = _param(vdaf, params, "length")
        if "max_measurement" not in params and "bits" in params:
            top = (1 << _param(vdaf, params, "bits")) - 1
        else:
            top = _param(vdaf, params, "max_measurement")
        return Sensitivity(length, top)
    if vdaf == "Prio3Histogram":
        return Sensitivity(min(2, _param(vdaf, params, "length")), 1)
    if vdaf == "Prio3MultihotCountVec":
        length = _param(vdaf, params, "length")
        weight = _param(vdaf, params, "max_weight")
        if weight > length:
            raise InvalidSensitivity(
                f"Prio3MultihotCountVec max_weight ({weight}) cannot exceed length ({length})"
            )
        return Sensitivity(min(2 * weight, length), 1)
    if vdaf == "Prio3L1BoundSum":
        length = _param(vdaf, params, "length")
        top = _param(vdaf, params, "max_value")
        return Sensitivity(length, top, min(2, length) * top)
    raise InvalidSensitivity(
        f"unknown VDAF type {vdaf!r}; sensitivity is defined for {', '.join(VDAF_TYPES)}"
    )

"""Exceptions raised by veil.dp.

Every error names what was asked and why it was refused, so the service layer can
pass the message on unchanged (as INVALID_ARGUMENT, NOT_FOUND or RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

from fractions import Fraction


class DPError(Exception):
    """Base class of all veil.dp errors."""


class InvalidParameter(DPError, ValueError):
    """A DP parameter (ε, ρ, scale, mechanism, mode, bits, ...) is out of range."""


class InvalidSensitivity(InvalidParameter):
    """A declared sensitivity does not fit the Prio3 type and its parameters."""


class UnknownTask(DPError, LookupError):
    """The budget ledger has no task (or survey) of this id."""


class BudgetExceeded(DPError):
    """A spend was refused because it would exceed a privacy budget.

    Attributes say what was asked, what remains and why, so that a collector can
    decide whether a smaller ε (or a disjoint batch) would fit.
    """

    def __init__(self, asked: Fraction, remaining: Fraction, why: str) -> None:
        self.asked = asked
        self.remaining = remaining
        self.why = why
        super().__init__(
            f"privacy budget exceeded: asked for {asked} (≈{float(asked):.6g}), "
            f"{remaining} (≈{float(remaining):.6g}) remains; {why}"
        )

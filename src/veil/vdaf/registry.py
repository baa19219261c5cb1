"""The VDAF types veil runs, by the name task files give them: one registry.

Each entry says what a task file calls the type, its name in the draft
(draft-irtf-cfrg-vdaf section 7.4, and the key veil.dp uses for its
sensitivity), which parameters it takes in the order of its constructor, how
it is built for two aggregators, whether its aggregate is one number or a
vector, and how a measurement is read from the command line. Task files,
the CLI's choices, survey questions, measurement parsing, the collector's
decoding and the DP sensitivities are all derived from here.

(The batched circuits are chosen by circuit class in
`veil.vdaf.batch.circuits.batch_circuit`, one level below: every type here
builds one of those circuits.)

Poplar1, whose aggregation parameter (a level and candidate prefixes)
makes a collection a sequence of queries, is named apart in
`PREFIX_KINDS`: the task files, the protocol and the survey take it up
when they carry aggregation parameters; until then `KINDS` is what they
accept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from veil.vdaf.spec.poplar1 import Poplar1
from veil.vdaf.spec.prio3 import (
    Prio3,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
)

# veil runs Prio3 between exactly two aggregators (leader and helper).
SHARES = 2


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _count_from_text(text: str) -> int:
    words = {"true": 1, "yes": 1, "false": 0, "no": 0}
    return words[text.lower()] if text.lower() in words else int(text)


@dataclass(frozen=True)
class VdafKind:
    """One Prio3 type as veil's files and commands know it."""

    name: str  # in task files (`[vdaf] type`) and on the command line
    prio3: str  # the draft's name
    params: tuple[str, ...]  # its parameters, in the constructor's order
    vector: bool  # the aggregate is a vector (else one number)
    build: Callable[..., Prio3[Any, Any]]
    from_text: Callable[[str], Any]  # a measurement from its command-line text
    measurement: str  # what a measurement is, in words

    def make(self, params: Mapping[str, int]) -> Prio3[Any, Any]:
        """The instance for two aggregators; `params` must hold exactly `self.params`."""
        missing = [p for p in self.params if p not in params]
        extra = [p for p in params if p not in self.params]
        if missing or extra:
            raise ValueError(
                f"{self.name} takes the parameters {', '.join(self.params) or 'none'}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; not {', '.join(extra)}" if extra else "")
            )
        return self.build(SHARES, *(params[p] for p in self.params))

    def parse(self, text: str) -> Any:
        """A measurement from the command line (ValueError if it is not one)."""
        try:
            return self.from_text(text.strip())
        except ValueError:
            raise ValueError(f"not a valid {self.name} measurement: {text!r}") from None


KINDS: dict[str, VdafKind] = {
    k.name: k
    for k in (
        VdafKind("count", "Prio3Count", (), False, Prio3Count, _count_from_text, "0 or 1"),
        VdafKind(
            "sum", "Prio3Sum", ("max_measurement",), False, Prio3Sum, int, "an int in [0, max]"
        ),
        VdafKind(
            "sumvec",
            "Prio3SumVec",
            ("length", "max_measurement", "chunk_length"),
            True,
            Prio3SumVec,
            _ints,
            "comma-separated ints in [0, max]",
        ),
        VdafKind(
            "histogram",
            "Prio3Histogram",
            ("length", "chunk_length"),
            True,
            Prio3Histogram,
            int,
            "a bucket index in [0, length)",
        ),
        VdafKind(
            "multihot",
            "Prio3MultihotCountVec",
            ("length", "max_weight", "chunk_length"),
            True,
            Prio3MultihotCountVec,
            lambda text: [bool(v) for v in _ints(text)],
            "comma-separated 0/1, at most max_weight ones",
        ),
        VdafKind(
            "l1boundsum",
            "Prio3L1BoundSum",
            ("length", "max_value", "chunk_length"),
            True,
            Prio3L1BoundSum,
            _ints,
            "comma-separated ints >= 0 summing to at most max_value",
        ),
    )
}
NAMES = tuple(KINDS)
# Every parameter any type takes (the settings of a task's [vdaf] table).
PARAMS = tuple(dict.fromkeys(p for k in KINDS.values() for p in k.params))


def kind(name: str) -> VdafKind:
    """The registered type called `name`; KeyError names the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown VDAF type {name!r}; expected one of {', '.join(NAMES)}") from None


@dataclass(frozen=True)
class PrefixKind:
    """A VDAF queried with an aggregation parameter, as veil's files name it."""

    name: str
    draft: str  # the draft's name
    params: tuple[str, ...]
    build: Callable[..., Poplar1]
    measurement: str

    def make(self, params: Mapping[str, int]) -> Poplar1:
        """The instance; `params` must hold exactly `self.params`."""
        missing = [p for p in self.params if p not in params]
        extra = [p for p in params if p not in self.params]
        if missing or extra:
            raise ValueError(
                f"{self.name} takes the parameters {', '.join(self.params)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; not {', '.join(extra)}" if extra else "")
            )
        return self.build(*(params[p] for p in self.params))


PREFIX_KINDS: dict[str, PrefixKind] = {
    k.name: k
    for k in (
        PrefixKind(
            "poplar1",
            "Poplar1",
            ("bits",),
            Poplar1,
            "a string of bits/8 bytes (shorter answers padded by the caller)",
        ),
    )
}

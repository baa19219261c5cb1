"""Finding a text question's answers: the collector's descent, one query per byte.

A text question's task is Poplar1 over 8·B-bit strings (`veil.survey.text`).
The collector asks the same batch B times, at levels 7, 15, ..., 8B - 1; each
query names candidate prefixes of k + 1 bytes and gets back their noisy counts
(each aggregator noises every count it releases: `veil.dp.heavy_hitters`). The
candidates of the next level are the survivors of this one (noisy count at least
the threshold T) extended by every byte value; dropping the others is
post-processing of released counts and costs nothing.

What the encoding makes impossible is never asked about (all of it public:
`veil.survey.text` says how an answer is normalised). An answer is UTF-8 text
followed by zero padding only, so a prefix ending in a zero byte has one child
(another zero); inside a character only continuation bytes follow (the first
one in the narrower range UTF-8 allows after E0, ED, F0 and F4); after a whole
character, zero, ASCII or a lead byte C2..F4. The answer is trimmed, so it does
not start with a whitespace character (nor with zero: an empty answer is
refused) and is not padded right after one. Unless the question is
case-sensitive it is lower-cased, so A..Z never occur (`lower_case`). A prefix
of ASCII letters then has 153 children instead of 256. A report whose string
breaks these rules (only a client that skips the normalisation sends one) may
then go unfound; that is all it can cause.

When every survivor ends in padding, each is a whole answer with one possible
continuation, so the next query goes straight to the last level with the
survivors padded to full length (the draft's rule, which veil's aggregators
enforce, asks only that levels increase and that prefixes extend the last
query's): the levels in between are neither queried nor charged. The released
answers are the same; each was tested against the threshold at fewer levels,
so the stated detection floor (every level passed) still holds.

A query names at most `max_prefixes` candidates (both aggregators refuse more):
when the survivors would need more, the ones with the highest noisy counts are
extended first and the rest are dropped (post-processing again; `dropped` says how
many). After the last level the survivors are the answers found.

`TextProgress` is what a run keeps on disk between levels (`veil survey collect`
resumes from it): the levels done, the survivors with their noisy counts, and the
job id of the level under way, written before that job exists.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from veil.survey.text import WHITE_SPACE

__all__ = [
    "LevelQuery",
    "TextProgress",
    "candidates",
    "descend",
    "finished",
    "next_bytes",
    "prefix_bits",
]

# The collector's query of one level: (byte level k, candidate prefixes of k + 1
# bytes, the job id to use) -> one noisy count per candidate, in order.
LevelQuery = Callable[[int, Sequence[bytes], bytes], Sequence[int]]


def prefix_bits(prefix: bytes) -> tuple[bool, ...]:
    """A prefix of whole bytes as Poplar1 names it: its bits, most significant first."""
    return tuple(bool(byte >> shift & 1) for byte in prefix for shift in range(7, -1, -1))


def candidates(
    survivors: Sequence[tuple[bytes, int]], max_prefixes: int, lower_case: bool = False
) -> tuple[list[bytes], int]:
    """(the next level's candidates in sorted order, how many survivors were dropped).

    With no survivors yet (the first level) the candidates are the possible first
    bytes. Survivors are extended by the bytes that may follow them (`next_bytes`),
    highest noisy count first, while the candidates fit in `max_prefixes`.
    """
    if not survivors:
        return [bytes([b]) for b in next_bytes(b"", lower_case)][:max_prefixes], 0
    out: list[bytes] = []
    dropped = 0
    for prefix, _ in sorted(survivors, key=lambda s: (-s[1], s[0])):
        children = [prefix + bytes([b]) for b in next_bytes(prefix, lower_case)]
        if len(out) + len(children) > max_prefixes:
            dropped += 1
            continue
        out.extend(children)
    return sorted(out), dropped


def finished(survivors: Sequence[tuple[bytes, int]]) -> bool:
    """Whether every survivor is a whole answer (ends in padding): then only
    padding follows and the descent may skip to the last level."""
    return bool(survivors) and all(p.endswith(b"\x00") for p, _ in survivors)


# After a whole character: the padding's zero, ASCII, or a lead byte (C2..F4).
_STARTS = (*range(0x80), *range(0xC2, 0xF5))
_UPPER = frozenset(range(0x41, 0x5B))  # A..Z
# The continuation bytes that may follow each lead byte (UTF-8 excludes
# overlong forms, the surrogates and code points above U+10FFFF).
_SECOND = {0xE0: range(0xA0, 0xC0), 0xED: range(0x80, 0xA0), 0xF0: range(0x90, 0xC0)}
_SECOND[0xF4] = range(0x80, 0x90)
_CONTINUATIONS = range(0x80, 0xC0)


def next_bytes(prefix: bytes, lower_case: bool = False) -> tuple[int, ...]:
    """The bytes that may follow `prefix` in an encoded answer (padded UTF-8,
    trimmed; with `lower_case`, lower-cased)."""
    if prefix.endswith(b"\x00"):
        return (0,)
    start = 0  # where the last character begins
    pending = 0  # continuation bytes it still needs
    for i, byte in enumerate(prefix):
        if pending and 0x80 <= byte < 0xC0:
            pending -= 1
        else:
            start = i
            pending = (byte >= 0xC0) + (byte >= 0xE0) + (byte >= 0xF0)
    if pending:
        lead = prefix[start]
        follow = _SECOND.get(lead, _CONTINUATIONS) if start == len(prefix) - 1 else _CONTINUATIONS
        if pending == 1 and start == 0:
            # The byte completes the first character: not a whitespace one.
            return tuple(b for b in follow if not _space(prefix + bytes([b])))
        return tuple(follow)
    last = prefix[start:]
    return tuple(
        b
        for b in _STARTS
        if not (lower_case and b in _UPPER)
        # The first character is not whitespace nor the padding; the padding
        # does not follow a whitespace character.
        and not (not prefix and (b == 0 or _space(bytes([b]))))
        and not (b == 0 and _space(last))
    )


def _space(char: bytes) -> bool:
    """Whether the UTF-8 bytes are one whitespace character (trimmed away)."""
    return char.decode("utf-8", errors="replace") in WHITE_SPACE


@dataclass
class TextProgress:
    """One text question's descent so far (saved between levels)."""

    levels: int  # B: the levels to query
    done: int = 0  # levels queried
    survivors: list[tuple[bytes, int]] = field(default_factory=list)
    job: str | None = None  # the job of level `done`, created or about to be
    dropped: int = 0  # survivors left unextended to respect max_prefixes
    queried: list[int] = field(default_factory=list)  # candidates per level

    @property
    def finished(self) -> bool:
        """Every level queried, or nothing left to extend."""
        return self.done >= self.levels or (self.done > 0 and not self.survivors)

    def to_json(self) -> dict[str, Any]:
        return {
            "levels": self.levels,
            "done": self.done,
            "survivors": [[p.hex(), c] for p, c in self.survivors],
            "job": self.job,
            "dropped": self.dropped,
            "queried": self.queried,
        }

    @staticmethod
    def from_json(doc: Any) -> TextProgress:
        """The progress saved by `to_json`; ValueError if it is not that."""
        try:
            progress = TextProgress(
                int(doc["levels"]),
                int(doc["done"]),
                [(bytes.fromhex(p), int(c)) for p, c in doc["survivors"]],
                None if doc["job"] is None else str(doc["job"]),
                int(doc["dropped"]),
                [int(x) for x in doc["queried"]],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a text question's progress: {e}") from None
        if not 0 <= progress.done <= progress.levels or any(
            len(p) != progress.done for p, _ in progress.survivors
        ):
            raise ValueError("not a text question's progress: levels and prefixes disagree")
        if progress.job is not None and len(bytes.fromhex(progress.job)) != 16:
            raise ValueError(f"bad collection job id {progress.job!r}")
        return progress


def descend(
    progress: TextProgress,
    threshold: int,
    max_prefixes: int,
    query: LevelQuery,
    save: Callable[[TextProgress], None],
    say: Callable[[str], None] = lambda _: None,
    lower_case: bool = False,
) -> TextProgress:
    """Query the remaining levels, saving `progress` before each job is created and
    after each level; returns the finished progress (its survivors: the answers).
    `lower_case`: the question's answers are lower-cased (not case-sensitive).

    `query` may raise to stop the run: what is saved resumes it (the level under
    way with the same job id, so the aggregators answer it again, not twice).
    """
    while not progress.finished:
        if finished(progress.survivors):
            # Whole answers only: straight to the last level.
            level = progress.levels - 1
            names = sorted(p.ljust(progress.levels, b"\x00") for p, _ in progress.survivors)
            dropped = 0
        else:
            level = progress.done
            names, dropped = candidates(progress.survivors, max_prefixes, lower_case)
        if progress.job is None:
            progress = replace(progress, job=secrets.token_bytes(16).hex())
            save(progress)  # before the job exists: a kill now resumes it
        assert progress.job is not None
        say(f"byte {level + 1} of {progress.levels}: {len(names):,} candidates")
        counts = query(level, names, bytes.fromhex(progress.job))
        if len(counts) != len(names):
            raise ValueError(f"{len(counts)} counts for {len(names)} candidates")
        kept = [(p, c) for p, c in zip(names, counts, strict=True) if c >= threshold]
        progress = TextProgress(
            progress.levels,
            level + 1,
            kept,
            None,
            progress.dropped + dropped,
            [*progress.queried, len(names)],
        )
        save(progress)
    return progress

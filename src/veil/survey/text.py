"""Text questions (issue 27): what a respondent types, as the string Poplar1 counts,
and the DP settings of the question (`veil.dp.heavy_hitters`).

`encode_text_answer` is the Python twin of the JavaScript client's
`encodeTextAnswer` (js/src/text.js): both are tested against the same cases
(tests/fixtures/text_answers.json), so one answer typed in the browser or given
to `veil survey respond` is the same string. The normalisation, in this order:

1. Unicode NFC.
2. Trim the characters with the Unicode White_Space property from both ends
   (`WHITE_SPACE`; not `str.strip`, which also strips U+001C..U+001F and differs
   from JavaScript's trim). Inner whitespace is kept as typed.
3. Unless the question is case-sensitive: `str.lower` (Unicode default
   lower-casing, locale-free), then NFC again (lower-casing may undo it).
4. Refused with a `TextAnswerError` whose `code` names the rule: an empty result
   ("empty"), a lone surrogate ("invalid"), U+0000 ("nul": it would read as the
   padding), more than `max_bytes` bytes of UTF-8 after normalisation ("too_long").

The measurement is the UTF-8 bytes padded with zero bytes to `max_bytes`, each
byte most significant bit first: 8 · max_bytes bits, the task's Poplar1 `bits`.
Level 8k - 1 of the IDPF tree holds the answers' first k bytes.

Python's Unicode tables (3.11: Unicode 14) may be older than a browser's, so a
character assigned since may normalise differently on the two sides; one answer
then counts as two strings.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from veil.dp.accounting import Neighbouring
from veil.dp.heavy_hitters import HeavyHittersPlan, Threshold, resolve_threshold
from veil.dp.mechanisms import DPConfig, Mechanism

__all__ = [
    "MAX_PREFIXES",
    "WHITE_SPACE",
    "EncodedText",
    "TextAnswerError",
    "answer_from_bytes",
    "encode_text_answer",
    "text_plan",
    "text_threshold",
]

# The Unicode White_Space property (PropList.txt), the same list as js/src/text.js.
WHITE_SPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# The most candidate prefixes one level's query asks about (both aggregators refuse
# more: veil.task.MAX_QUERY_PREFIXES): 16 survivors of the
# previous level, each extended by every byte. `veil survey collect` extends the 16
# highest noisy counts if more pass the threshold (post-processing), and the
# threshold is set so that this many empty prefixes are rarely kept
# (`veil.dp.heavy_hitters.release_threshold`, `candidates`).
MAX_PREFIXES = 16 * 256


class TextAnswerError(ValueError):
    """A text answer that cannot be counted; `code` names the rule it broke
    (empty, invalid, nul, too_long, type), as the JavaScript client's does."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class EncodedText:
    """A normalised answer (`text`, what is counted), its UTF-8 bytes padded to
    max_bytes, and their bits (the Poplar1 measurement)."""

    text: str
    data: bytes
    measurement: tuple[bool, ...]


def encode_text_answer(answer: Any, max_bytes: int, case_sensitive: bool = False) -> EncodedText:
    """Normalise `answer` and encode it as a Poplar1 measurement of 8·max_bytes bits.

    Raises TextAnswerError (with `code`) for an answer that cannot be counted, and
    ValueError for a max_bytes outside [1, 256] (the JavaScript client's bound).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= 256:
        raise ValueError(f"max_bytes must be an integer in [1, 256], got {max_bytes!r}")
    if not isinstance(answer, str):
        raise TextAnswerError("type", "a text answer must be a string")
    if _LONE_SURROGATE.search(answer):
        raise TextAnswerError("invalid", "the answer is not valid Unicode text (a lone surrogate)")
    text = unicodedata.normalize("NFC", answer).strip(WHITE_SPACE)
    if not case_sensitive:
        text = unicodedata.normalize("NFC", text.lower())
    if not text:
        raise TextAnswerError("empty", "the answer is empty")
    if "\x00" in text:
        raise TextAnswerError("nul", "the answer contains a NUL character (U+0000)")
    utf8 = text.encode("utf-8")
    if len(utf8) > max_bytes:
        raise TextAnswerError(
            "too_long",
            f"the answer is too long: {len(utf8)} bytes in UTF-8, at most {max_bytes}"
            " (a letter outside ASCII takes 2 to 4 bytes)",
        )
    data = utf8 + bytes(max_bytes - len(utf8))
    bits = tuple(bool(byte >> shift & 1) for byte in data for shift in range(7, -1, -1))
    return EncodedText(text, data, bits)


def answer_from_bytes(prefix: bytes) -> str:
    """A recovered string as people read it: the bytes up to the padding, decoded
    as UTF-8 (undecodable bytes shown as U+FFFD: a prefix cut inside a letter)."""
    return prefix.rstrip(b"\x00").decode("utf-8", errors="replace")


def text_plan(
    max_bytes: int,
    mechanism: str,
    epsilon: Fraction | None,
    rho: Fraction | None,
    neighbouring: str,
) -> HeavyHittersPlan:
    """The question's budget over its `max_bytes` levels (independent noise, as
    every survey question). Raises veil.dp's InvalidParameter when a level's share
    is below the smallest ε (or ρ) a collection may spend."""
    mech = Mechanism(mechanism)
    if mech is Mechanism.NONE:
        config = DPConfig(mech)
    elif mech is Mechanism.GAUSSIAN:
        config = DPConfig(mech, rho=rho)
    else:
        config = DPConfig(mech, epsilon=epsilon)
    return HeavyHittersPlan(
        config, max_bytes, Neighbouring(neighbouring), max_prefixes=MAX_PREFIXES
    )


def text_threshold(
    plan: HeavyHittersPlan,
    threshold: int | None,
    min_share: Fraction | None,
    respondents: int | None,
) -> Threshold:
    """The release threshold: the operator's `threshold`, `min_share` of the expected
    respondents, or else the least keeping an answer given once below a 10⁻³ chance
    of release and empty prefixes among `MAX_PREFIXES` candidates rare."""
    return resolve_threshold(
        plan,
        threshold=threshold,
        min_share=min_share,
        respondents=respondents,
        candidates=MAX_PREFIXES,
    )

"""The survey with a free-text question ("Which editor do you use most?")
that the text-survey tests deploy, with mechanism none and a batch floor of
two, so that an answer given at least twice is released exactly."""

from __future__ import annotations

from veil.times import format_time

EDITORS = """\
[survey]
name = "Editors"
mechanism = "none"
min_batch_size = 2
max_respondents = 1000
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "editor"
text = "Which editor do you use most?"
kind = "text"
max_bytes = {max_bytes}
"""

# A second question, answered beside the text one.
REMOTE = """
[[question]]
id = "remote"
text = "Do you work remotely?"
kind = "yes_no"
"""


def editors_survey(opens: int, closes: int, tp: int, max_bytes: int, more: str = "") -> str:
    """The survey's TOML for a window [opens, closes) with time precision
    `tp`, answers of at most `max_bytes` bytes, and the questions `more` after
    the text one."""
    return (
        EDITORS.format(
            tp=tp, opens=format_time(opens), closes=format_time(closes), max_bytes=max_bytes
        )
        + more
    )

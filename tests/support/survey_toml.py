"""Question blocks of survey.toml that several tests' surveys share, so a
survey reads as its header, these blocks and what is its own. Each block
ends with a newline; the blank line between two blocks is the caller's."""

from __future__ import annotations

TEAMS = ("engineering", "design", "sales")


def remote(required: bool = False) -> str:
    """The yes/no question "remote"."""
    block = """\
[[question]]
id = "remote"
text = "Do you work remotely most days?"
kind = "yes_no"
"""
    return block + ("required = true\n" if required else "")


def commute(max_minutes: int = 180) -> str:
    """The integer question "commute", in minutes up to `max_minutes`."""
    return f"""\
[[question]]
id = "commute"
text = "How many minutes is your commute?"
kind = "integer"
max = {max_minutes}
"""


def team(options: tuple[str, ...] = TEAMS, text: str = "Which team are you in?") -> str:
    """The choice question "team" over `options`."""
    listed = ", ".join(f'"{option}"' for option in options)
    return f"""\
[[question]]
id = "team"
text = "{text}"
kind = "choice"
options = [{listed}]
"""

"""For both organisations and the survey operator: `veil survey close`
(end a survey early) and `veil survey extend` (give it more time), each run
on the runner's own part of the deployment (veil.reschedule)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from veil.times import TimeFormatError, format_duration, format_time, parse_time

if TYPE_CHECKING:
    from veil.reschedule import Window


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except TimeFormatError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_survey_close(args: argparse.Namespace) -> int:
    return _change("close", args, args.at)


def cmd_survey_extend(args: argparse.Namespace) -> int:
    return _change("extend", args, args.until)


def _change(verb: str, args: argparse.Namespace, end: int | None) -> int:
    from veil.reschedule import RescheduleError, check_close, check_extend, load_parties, reschedule

    name = f"veil survey {verb}"
    now = time.time()
    try:
        parties, window = load_parties(Path(args.deployment))
        if end is None:  # close now: at the end of the current interval
            # Strictly after any report made by now: int(now) rounds down, and
            # an aligned second would close at a time already passed.
            end = _round_up(math.ceil(now), window.time_precision)
        if verb == "close":
            check_close(window, end)
        else:
            check_extend(window, end, now, parties)
        written = reschedule(parties, end)
    except RescheduleError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{name}: {e}: nothing or part was written; run it again", file=sys.stderr)
        return 1
    where = ", ".join(f"{p.party}/" for p in parties)
    if not written:
        print(f"{where}: the survey already ends at {format_time(end)}: nothing changed")
    else:
        print(_said(verb, window, end, now))
        print(f"{len(written)} files changed in {where}")
    option = "--at" if verb == "close" else "--until"
    servers = [p.party for p in parties if p.party in ("leader", "helper")]
    if servers:
        print(
            f"reload the {' and the '.join(servers)} (each server and `veil worker`: kill -HUP"
            " <pid>) or restart them; until both aggregators have the same window the helper"
            " refuses the leader's jobs of these tasks, and they wait"
        )
    here = {p.party for p in parties}
    others = [f"{p}/" for p in ("leader", "helper", "collector", "client") if p not in here]
    if others:
        print(
            f"the other parties ({', '.join(others)}) change their own files the same way:"
            f" veil survey {verb} DIRECTORY {option} {format_time(end)}"
        )
    return 0


def _said(verb: str, window: Window, end: int, now: float) -> str:
    was = f"(was {format_time(window.closes)})"
    if verb == "close":
        after = "now" if end <= now else f"in {format_duration(end - now)}"
        return (
            f"the survey closes at {format_time(end)} {was}: uploads from then on are refused,"
            f" and it can be collected then ({after})"
        )
    return f"the survey is extended to {format_time(end)} {was}"


def _round_up(t: int, step: int) -> int:
    return t if t % step == 0 else t - t % step + step


def register(survey: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    where = (
        "DEPLOYMENT is the directory `veil survey deploy` wrote, or the part of it you hold"
        " (leader/, helper/, collector/ or client/): every file there that states the window is"
        " changed, after checking they all state the same one. Each organisation runs the"
        " command on its own part, with the same time, and reloads its servers (SIGHUP) or"
        " restarts them; the survey operator changes collector/ and client/ (and publishes"
        " client/ again). Until the leader's and the helper's files agree, the helper refuses"
        " the leader's jobs and collections of the survey, naming both windows."
    )
    p = survey.add_parser(
        "close",
        help="end a deployed survey early (each organisation on its own files)",
        description="End a survey before its window's end: the leader refuses uploads from"
        " the new end on, and the survey can be collected once it has passed. " + where,
    )
    p.add_argument("deployment", metavar="DEPLOYMENT", help="the deployment, or your part of it")
    p.add_argument(
        "--at",
        type=_time,
        metavar="TIME",
        help="the new end (RFC 3339, e.g. 2026-05-03T12:00:00Z), on the survey's time precision"
        " and no later than its current end (default: now, rounded up to the time precision;"
        " the other organisation then gives the time this prints)",
    )
    p.set_defaults(func=cmd_survey_close)

    p = survey.add_parser(
        "extend",
        help="give a deployed survey more time (each organisation on its own files)",
        description="Move a survey's end later. What was collected stays collected: a batch"
        " is released once, and uploads to it stay refused. " + where,
    )
    p.add_argument("deployment", metavar="DEPLOYMENT", help="the deployment, or your part of it")
    p.add_argument(
        "--until",
        type=_time,
        required=True,
        metavar="TIME",
        help="the new end (RFC 3339), still to come, after the current end, on the survey's"
        " time precision",
    )
    p.set_defaults(func=cmd_survey_extend)

"""`veil survey close` and `veil survey extend`: a deployed survey's window
ended early or moved later, in the files of each party that runs it.

A survey's window is every one of its tasks' [not_before, not_after), in
each party's task files, and the survey's [opens, closes) in the collector's
survey.toml and the public survey.json. The two organisations each change
their own files (the leader's organisation its leader/, the helper's its
helper/, the survey operator collector/ and client/), to the same end, and
reload their servers (SIGHUP) or restart them; a directory holding several
parties' directories (a trial on one machine) has them all changed at once.
Until both aggregators' files agree the helper refuses the leader's jobs
and collections of the task, retryably, naming both windows
(veil.aggregator.core.check_window_agrees): nothing is aggregated or
released under two windows.

Closing moves the end earlier, to a time no later than the current end:
the leader refuses uploads from then on ("the survey is closed"), and the
survey can be collected as soon as it has passed. Extending moves the end
later, to a time still to come; it never reopens what was released: each
aggregator refuses uploads to, and a second collection of, a time bucket
already collected, and a collector/ directory that has collected refuses
to be extended. A survey over DAP keeps the task_interval it was deployed
with (bound into every share), and one whose task another implementation
serves is not extended past it: that implementation would refuse the
reports (docs/DAP.md, "A survey over DAP").
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from veil.files import replace_file
from veil.survey import DESCRIPTION_FILE, SurveyError, load_survey, parse_survey
from veil.task import CollectorTask, HelperTask, LeaderTask, Task, TaskError, load_task
from veil.task.files import write_toml
from veil.times import format_time

PARTIES = ("leader", "helper", "collector", "client")
# Written by `veil survey collect` into collector/ when it collects
# (veil.collector.survey.RECORD_FILE; not imported: collector is beside this
# module, not below it).
COLLECTED_RECORD = "collected-into.json"


class RescheduleError(ValueError):
    """The window cannot be changed as asked; nothing was written."""


@dataclass(frozen=True)
class TaskFile:
    party: str
    path: Path
    task: Task


@dataclass(frozen=True)
class PartyFiles:
    """One party's directory: its task files, and for the collector and the
    client the survey file that states the window too."""

    party: str
    directory: Path
    tasks: list[TaskFile]
    survey_file: Path | None = None


@dataclass(frozen=True)
class Window:
    """The survey's window as every file found gives it, and its batches'
    time precision."""

    opens: int
    closes: int
    time_precision: int


@dataclass(frozen=True)
class Rescheduled:
    """What a change did: the window before, the new end, the files written."""

    before: Window
    closes: int
    parties: list[PartyFiles]
    written: list[Path]


def find_parties(directory: str | Path) -> list[PartyFiles]:
    """The party directories at `directory`: itself if it is one (leader/,
    helper/, collector/ or client/ as `veil survey deploy` wrote them), else
    those of them it holds. RescheduleError if there is none."""
    root = Path(directory)
    if not root.is_dir():
        raise RescheduleError(f"{root}: not a directory")
    own = _party(root)
    if own is not None:
        return [own]
    found = [p for p in (_party(root / name) for name in PARTIES) if p is not None]
    if not found:
        raise RescheduleError(
            f"{root}: neither a deployment (the directory `veil survey deploy` wrote) nor one"
            " party's directory of it (leader/ with leader.toml, helper/ with helper.toml,"
            " collector/ with survey.toml, client/ with survey.json)"
        )
    return found


def _party(d: Path) -> PartyFiles | None:
    for role, kind in (("leader", LeaderTask), ("helper", HelperTask)):
        config = d / f"{role}.toml"
        if config.is_file():
            return PartyFiles(role, d, _server_tasks(config, kind))
    if (d / "survey.toml").is_file() and not (d / DESCRIPTION_FILE).exists():
        return _collector(d)
    if (d / DESCRIPTION_FILE).is_file():
        return _client(d)
    return None


def _server_tasks(config: Path, kind: type[Task]) -> list[TaskFile]:
    try:
        with config.open("rb") as f:
            names = tomllib.load(f).get("tasks")
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RescheduleError(f"{config}: {e}") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
        raise RescheduleError(f"{config}: `tasks` is not a list of task files")
    files = []
    for name in names:
        path = config.parent / name
        files.append(TaskFile(kind.role, path, _load(path, kind)))
    return files


def _collector(d: Path) -> PartyFiles:
    try:
        survey = load_survey(d / "survey.toml")
    except SurveyError as e:
        raise RescheduleError(str(e)) from None
    tasks = [
        TaskFile("collector", d / f"{q.id}.toml", _load(d / f"{q.id}.toml", CollectorTask))
        for q in survey.tasked  # the questions' and the breakdowns' tasks
    ]
    return PartyFiles("collector", d, tasks, d / "survey.toml")


def _client(d: Path) -> PartyFiles:
    from veil.survey.description import load_description

    try:
        description = load_description(d)
        loaded = description.load_tasks()
    except SurveyError as e:
        raise RescheduleError(str(e)) from None
    tasks = [TaskFile("client", description.task_files[q], t) for q, t in loaded.items()]
    return PartyFiles("client", d, tasks, d / DESCRIPTION_FILE)


def _load(path: Path, kind: type[Task]) -> Task:
    try:
        return load_task(path, kind)
    except (OSError, TaskError) as e:
        raise RescheduleError(f"{path}: {e}") from None


def current_window(parties: list[PartyFiles]) -> Window:
    """The one window every task file and survey file found gives; refuses
    files that disagree (two deployments mixed, or a change made to some
    files only) or a task id one party holds and another does not."""
    first = parties[0].tasks[0]
    for party in parties:
        for f in party.tasks:
            if f.task.window != first.task.window:
                raise RescheduleError(
                    f"{f.path} gives its task the window {_span(f.task.window)}, but {first.path}"
                    f" gives {_span(first.task.window)}: these files are not one survey's"
                    " deployment at one window (fix or remove the odd one out)"
                )
            if f.task.time_precision != first.task.time_precision:
                raise RescheduleError(
                    f"{f.path}: time_precision {f.task.time_precision} s, but {first.path}:"
                    f" {first.task.time_precision} s: these files are not one survey's"
                )
    ids = {p.party: {f.task.task_id for f in p.tasks} for p in parties}
    for name, got in ids.items():
        for other, theirs in ids.items():
            if got != theirs:
                raise RescheduleError(
                    f"{name}/ and {other}/ hold the task files of different tasks: they are"
                    " not one deployment"
                )
    for party in parties:
        if party.survey_file is not None:
            opens, closes = _survey_window(party)
            if (opens, closes) != first.task.window:
                raise RescheduleError(
                    f"{party.survey_file} gives the survey the window {_span((opens, closes))},"
                    f" but its task files {_span(first.task.window)}"
                )
    opens, closes = first.task.window
    return Window(opens, closes, first.task.time_precision)


def _survey_window(party: PartyFiles) -> tuple[int, int]:
    assert party.survey_file is not None
    if party.party == "collector":
        survey = load_survey(party.survey_file)
    else:
        from veil.survey.description import load_description

        survey = load_description(party.directory).survey
    assert survey.opens is not None and survey.closes is not None
    return survey.opens, survey.closes


def _span(window: tuple[int, int]) -> str:
    return f"[{format_time(window[0])}, {format_time(window[1])})"


def check_close(window: Window, at: int) -> None:
    """Refuses a close that is no close: at or before the survey opens,
    after its current end (an extension), or off the time precision."""
    _check_aligned(window, at)
    if at > window.closes:
        raise RescheduleError(
            f"{format_time(at)} is after the survey's current end, {format_time(window.closes)}:"
            " closing only moves the end earlier (to move it later: veil survey extend)"
        )
    if at <= window.opens:
        raise RescheduleError(
            f"{format_time(at)} is not after the survey opens ({format_time(window.opens)}):"
            " a survey closes after it opens"
        )


def check_extend(window: Window, until: int, now: float, parties: list[PartyFiles]) -> None:
    """Refuses an extension that is none: not after the current end, or not
    after now (it would reopen nothing), off the time precision, of a
    survey whose collection has begun, or past the task_interval of a DAP
    task another implementation serves."""
    _check_aligned(window, until)
    if until < window.closes:
        raise RescheduleError(
            f"{format_time(until)} is before the survey's current end,"
            f" {format_time(window.closes)}: extending only moves the end later (to end it"
            " earlier: veil survey close)"
        )
    if until <= now:
        raise RescheduleError(
            f"{format_time(until)} has passed: extend the survey to a time still to come"
        )
    for party in parties:
        if party.party == "collector" and (party.directory / COLLECTED_RECORD).exists():
            raise RescheduleError(
                f"{party.directory} has collected this survey (or begun to): its batch is"
                " released, and extending never reopens it"
            )
    _check_dap_interval(until, parties)


def _check_dap_interval(until: int, parties: list[PartyFiles]) -> None:
    """Refuses to move the end past a DAP task's deployed task_interval when
    another implementation serves it. The interval is bound into every share
    (the TaskConfiguration in the associated data), so it stays as deployed:
    veil's aggregators follow the window the files state, but another
    implementation refuses every report after the interval's end (the
    draft's task_interval extension), and the survey would seem open to
    respondents whose answers are all refused."""
    for party in parties:
        for f in party.tasks:
            dap = f.task.dap
            if dap is None or dap.other_implementation is None or dap.task_interval is None:
                continue
            end = dap.task_interval[1]
            if until > end:
                raise RescheduleError(
                    f"{f.path}: this task is served over DAP with another implementation as the"
                    f" {dap.other_implementation}, which refuses every report after the task"
                    f" interval deployed, ending {format_time(end)} (it is bound into every"
                    f" share and cannot move): extend the survey to {format_time(end)} at the"
                    " latest, or deploy a new survey for the time after it"
                )


def _check_aligned(window: Window, t: int) -> None:
    tp = window.time_precision
    if t % tp:
        down, up = t - t % tp, t - t % tp + tp
        raise RescheduleError(
            f"{format_time(t)} is not aligned to the survey's time precision of {tp} s"
            f" (batches are whole intervals): use {format_time(down)} or {format_time(up)}"
        )


def reschedule(parties: list[PartyFiles], closes: int) -> list[Path]:
    """Write every party's files with the window's end at `closes` (checked
    by the caller); returns the files written. Each file's new text is made
    and checked before the first is written."""
    writes: list[tuple[Path, bytes | None, Task | None, bool]] = []
    for party in parties:
        for f in party.tasks:
            if f.task.not_after != closes:
                writes.append(
                    (f.path, None, replace(f.task, not_after=closes), party.party != "client")
                )
        if party.survey_file is not None:
            text = (
                _survey_toml(party.survey_file, closes)
                if party.party == "collector"
                else _survey_json(party.survey_file, closes)
            )
            if text is not None:
                writes.append((party.survey_file, text, None, party.party == "collector"))
    for path, text, task, secret in writes:
        if task is not None:
            write_toml(path, task.to_dict(), secret)
        else:
            assert text is not None
            replace_file(path, text, 0o600 if secret else None)
    return [w[0] for w in writes]


_CLOSES = re.compile(
    r"^(?P<key>[ \t]*closes[ \t]*=[ \t]*)(?P<value>[^#\n]*?)(?P<rest>[ \t]*(#.*)?)$", re.M
)


def _survey_toml(path: Path, closes: int) -> bytes | None:
    """The survey file with `closes` set, its other text as it was; None if
    unchanged. Checked by reading it back: the same survey but its end."""
    text = path.read_text(encoding="utf-8")
    before = parse_survey(text, str(path))
    if before.closes == closes:
        return None
    matches = list(_CLOSES.finditer(text))
    if len(matches) != 1:
        raise RescheduleError(f"{path}: cannot find its one `closes = ...` line to change")
    m = matches[0]
    new = text[: m.start("value")] + format_time(closes) + text[m.end("value") :]
    try:
        after = parse_survey(new, str(path))
    except SurveyError as e:
        raise RescheduleError(f"{path}: changing `closes` would break it ({e})") from None
    if after != replace(before, closes=closes):
        raise RescheduleError(f"{path}: changing its `closes` line would change more than the end")
    return new.encode()


def _survey_json(path: Path, closes: int) -> bytes | None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    value = format_time(closes)
    if doc.get("closes") == value:
        return None
    doc["closes"] = value
    return json.dumps(doc, indent=2, ensure_ascii=False).encode() + b"\n"


def load_parties(directory: str | Path) -> tuple[list[PartyFiles], Window]:
    """The parties at `directory` and the window their files agree on."""
    try:
        parties = find_parties(directory)
        return parties, current_window(parties)
    except (SurveyError, TaskError, OSError) as e:
        raise RescheduleError(str(e)) from None

"""For respondents and client apps: `veil survey respond`, `veil upload`."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.cli.common import add_retired_ca, load_task_file, read_pem, setup_logging

if TYPE_CHECKING:
    from veil.survey import Question, Survey
    from veil.task import VdafSpec

# veil.client.outbox.DEFAULT_MAX_REPORTS, for the help text: importing the
# client to read it would cost every `veil` start a third of a CPU-second
# (tests/cli/test_respondent.py holds the two equal).
OUTBOX_MAX_REPORTS = 100_000


def parse_measurement(spec: VdafSpec, text: str) -> Any:
    """A measurement from its command-line text, as its VDAF type reads it
    (veil.vdaf.registry): an integer, or comma-separated integers."""
    return spec.kind.parse(text)


def _open_client(args: argparse.Namespace, command: str, task: Any, outbox: str | None) -> Any:
    """A Client from the trust and mTLS arguments; None (after saying why) on a user mistake.

    A task with a [dap] table gets a DapClient (`client_for`): DAP names no
    client certificate, so one is refused for it."""
    from veil.client import ClientOptions, OutboxError, client_for
    from veil.client.outbox import DEFAULT_MAX_REPORTS
    from veil.trust import TrustError

    if task.dap is not None:
        given = [
            flag
            for flag, value in (
                ("--client-cert", args.client_cert),
                ("--client-key", args.client_key),
            )
            if value is not None
        ]
        if given:
            print(
                f"veil {command}: {' and '.join(given)} cannot be used with this task: it is"
                " served over DAP, whose uploads take no client certificate",
                file=sys.stderr,
            )
            return None
    try:
        options = ClientOptions(
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
            outbox=outbox,
            outbox_max_reports=getattr(args, "outbox_max", None) or DEFAULT_MAX_REPORTS,
            retries=args.retries,
        )
        return client_for(task, options)
    except (OSError, TrustError, OutboxError, ValueError) as e:
        print(f"veil {command}: {e}", file=sys.stderr)
        return None


def _say_result(result: Any) -> int:
    """Print an upload's or flush's counts; 1 if reports were refused or stay pending."""
    noun = "report" if result.accepted == 1 else "reports"
    line = f"uploaded {result.accepted} {noun} ({result.duplicates} already stored)"
    extra = [
        f"{n} {what}"
        for n, what in (
            (result.pending, "pending in the outbox"),
            (result.refused, "refused by the leader (kept in the outbox)"),
            (result.expired, "expired unsent and dropped"),
        )
        if n
    ]
    print("; ".join([line, *extra]))
    if result.error is not None and result.retry_after is not None:
        print(
            f"the leader is busy, flush again in {result.retry_after:g} s or later: {result.error}",
            file=sys.stderr,
        )
    elif result.error is not None:
        print(f"the leader is unreachable, flush later: {result.error}", file=sys.stderr)
    return 1 if result.pending or result.refused else 0


def cmd_upload(args: argparse.Namespace) -> int:
    from veil.client import OutboxFull, UploadError
    from veil.task import Task

    setup_logging(args.log_level)
    task = load_task_file(args.task, Task, "upload")
    if task.issuer_public_key is not None:
        # Not an invalid measurement: this command carries no invitation token.
        print(
            "veil upload: this task takes reports from invited respondents only, each with"
            " a token from the survey's issuer, which veil upload does not fetch: answer with"
            " veil survey respond --survey-dir DIR --invitation CODE --issuer URL",
            file=sys.stderr,
        )
        return 2
    # Each value with where it came from, so that an error names the file
    # and line (or the argument) rather than an index into the batch.
    texts: list[tuple[str, str]] = []
    if args.file:
        try:
            lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            print(f"veil upload: cannot read --file {args.file}: {e}", file=sys.stderr)
            return 2
        texts += [
            (f"{args.file}:{n}", ln)
            for n, ln in enumerate(lines, 1)
            if ln.strip() and not ln.lstrip().startswith("#")
        ]
    texts += [(f"value {n}", v) for n, v in enumerate(args.values, 1)]
    if not texts:
        print("veil upload: give a value or --file", file=sys.stderr)
        return 2
    try:
        measurements = []
        for where, text in texts:
            try:
                measurements.append(parse_measurement(task.vdaf, text))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
    except ValueError as e:
        print(f"veil upload: {e}", file=sys.stderr)
        return 2
    client = _open_client(args, "upload", task, args.outbox)
    if client is None:
        return 2
    when = args.time
    if when is not None and task.dap is not None:
        # As veil's gRPC client does; DapClient takes whole time precisions only.
        when -= when % task.time_precision
    with client:
        try:
            result = client.upload_batch(measurements, report_time=when)
        except OutboxFull as e:
            print(f"veil upload: {e}", file=sys.stderr)
            return 1
        except ValueError as e:
            message = re.sub(
                r"^(?:report|measurement) (\d+)",
                lambda m: texts[int(m.group(1))][0],
                str(e),
                count=1,
            )
            print(f"veil upload: invalid measurement: {message}", file=sys.stderr)
            return 2
        except UploadError as e:
            print(f"veil upload: {e}", file=sys.stderr)
            return 1
    return _say_result(result)


def cmd_outbox_flush(args: argparse.Namespace) -> int:
    from veil.task import Task

    setup_logging(args.log_level)
    if not Path(args.outbox).is_file():
        print(f"veil outbox flush: no outbox at {args.outbox}", file=sys.stderr)
        return 2
    client = _open_client(
        args, "outbox flush", load_task_file(args.task, Task, "outbox flush"), args.outbox
    )
    if client is None:
        return 2
    with client:
        return _say_result(client.flush())


def cmd_outbox_status(args: argparse.Namespace) -> int:
    import json

    from veil.client import Outbox, OutboxError
    from veil.task import b64e

    if not Path(args.outbox).is_file():
        print(f"veil outbox status: no outbox at {args.outbox}", file=sys.stderr)
        return 2
    try:
        with Outbox(args.outbox) as box:
            tasks = box.status()
    except OutboxError as e:
        print(f"veil outbox status: {e}", file=sys.stderr)
        return 2
    rows = [
        {
            "task": b64e(t.task_id),
            "pending": t.pending,
            "refused": t.refused,
            "oldest": t.oldest,
            "delivered": t.delivered,
            "expired": t.expired,
        }
        for t in tasks
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("the outbox is empty")
    for r in rows:
        oldest = "" if r["oldest"] is None else f", oldest report time {r['oldest']}"
        print(
            f"task {r['task']}: {r['pending']} pending, {r['refused']} refused{oldest};"
            f" {r['delivered']} delivered, {r['expired']} expired"
        )
    return 0


def _connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retries",
        type=_count,
        default=5,
        metavar="N",
        help="resend a call that failed on the way up to N times, with backoff (default 5)",
    )
    _trust_arguments(p)


def _trust_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    p.add_argument("--helper-ca", help="PEM file of the CA of the helper (only the helper's)")
    p.add_argument("--client-cert", help="PEM client certificate, for an mTLS aggregator")
    p.add_argument("--client-key", help="PEM key of --client-cert")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def read_answers(path: Path) -> tuple[list[tuple[str, Any]], bool]:
    """The respondents in an answers file as (where, answers) pairs, and
    whether the file holds many (JSON Lines). Raises ValueError naming the
    file and line."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            with path.open("rb") as f:
                return [(str(path), tomllib.load(f))], False
        if suffix == ".json":
            return [(str(path), json.loads(path.read_text(encoding="utf-8")))], False
        if suffix in (".jsonl", ".ndjson"):
            many = []
            with path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            many.append((f"{path}:{n}", json.loads(line)))
                        except (json.JSONDecodeError, RecursionError) as e:
                            raise ValueError(f"{path}:{n}: not a JSON object: {e}") from None
            return many, True
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: not valid {suffix[1:].upper()}: {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from None
    raise ValueError(
        f"{path}: answers files end in .toml or .json (one respondent) or .jsonl (one"
        " respondent a line)"
    )


def _show(q: Question, answer: Any) -> str:
    if q.kind == "text":
        from veil.survey.text import encode_text_answer

        counted = encode_text_answer(answer, q.max_bytes, q.case_sensitive).text
        return counted if counted == answer else f"{answer} (counted as {counted!r})"
    if q.kind == "points":
        # The split as it will be sent, by option name, with what is left of the total.
        given = q.to_measurement(answer)
        split = ", ".join(f"{o} {p}" for o, p in zip(q.options, given, strict=True) if p)
        return f"{split or 'no points'} ({sum(given)} of {q.total} points)"
    if isinstance(answer, list):
        return ", ".join(map(str, answer)) or "(none)"
    return str(answer)


def answer_from_text(q: Question, text: str) -> Any:
    """An answer as typed on the terminal or given by --answer, in the terms
    `Question.to_measurement` takes: an option by its name or its number, a list
    of them or of numbers separated by commas, a points split as option:points
    pairs (`veil.survey.answers.parse_points`), anything else as typed."""
    text = text.strip()
    if q.kind in ("choice", "multi_choice"):
        picks = [t.strip() for t in text.split(",")] if q.kind == "multi_choice" else [text]
        picks = [
            q.options[int(t) - 1] if t.isdigit() and 1 <= int(t) <= len(q.options) else t
            for t in picks
            if t
        ]
        return picks if q.kind == "multi_choice" else picks[0]
    if q.kind == "vector":
        return [t.strip() for t in text.split(",")]
    return text


def answers_from_options(survey: Survey, given: list[str]) -> dict[str, Any]:
    """One respondent's answers from --answer ID=TEXT options (each TEXT as the
    terminal takes it); ValueError names a malformed option, an unknown or repeated
    question, or an answer that does not fit."""
    from veil.survey import AnswerError

    answers: dict[str, Any] = {}
    for option in given:
        qid, sep, text = option.partition("=")
        qid = qid.strip()
        if not sep:
            raise ValueError(f"--answer {option!r}: give ID=ANSWER, e.g. --answer remote=yes")
        try:
            q = survey.question(qid)
        except KeyError:
            known = ", ".join(q.id for q in survey.questions)
            raise ValueError(
                f"--answer {option!r}: no question {qid!r} (questions: {known})"
            ) from None
        if qid in answers:
            raise ValueError(f"--answer: question {qid!r} is answered twice")
        answer = answer_from_text(q, text)
        try:
            q.to_measurement(answer)
        except AnswerError as e:
            raise ValueError(f"--answer {option!r}: {e}") from None
        answers[qid] = answer
    return answers


def ask(survey: Survey, read: Callable[[str], str], write: Callable[[str], None]) -> dict[str, Any]:
    """Ask each question on the terminal until the answer fits; an empty answer
    leaves the question out. Raises EOFError when the respondent quits."""
    from veil.survey import AnswerError

    answers: dict[str, Any] = {}
    total = len(survey.questions)
    for n, q in enumerate(survey.questions, 1):
        write(f"\n{n}/{total} {q.text}")
        if q.kind == "yes_no":
            hint = "yes or no"
        elif q.kind == "integer":
            hint = f"a whole number from 0 to {q.max}"
        elif q.kind == "vector":
            names = ", ".join(q.element_labels())
            hint = f"{q.length} numbers from 0 to {q.max}, separated by commas ({names})"
        elif q.kind == "text":
            case = "" if q.case_sensitive else ", counted in lower case"
            hint = f"a short text, at most {q.max_bytes} bytes{case}"
        elif q.kind == "points":
            for i, option in enumerate(q.options, 1):
                write(f"  {i}) {option}")
            hint = (
                f"up to {q.total} points in all, as option:points separated by commas"
                f" (e.g. 1:{q.total // 2}); an option left out gets 0"
            )
        else:
            for i, option in enumerate(q.options, 1):
                write(f"  {i}) {option}")
            hint = (
                "a number or a name"
                if q.kind == "choice"
                else f"up to {q.max_choices} numbers or names, separated by commas"
            )
        while True:
            text = read(f"[{hint}{'' if q.required else '; empty to skip'}] > ").strip()
            if not text and q.required:
                write("  this question needs an answer")
                continue
            if not text:
                break
            answer = answer_from_text(q, text)
            try:
                q.to_measurement(answer)
            except AnswerError as e:
                write(f"  {e}")
                continue
            answers[q.id] = answer
            break
    return answers


def cmd_survey_respond(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from veil.client import SurveyClient, UploadError
    from veil.invite.client import InvitationError
    from veil.survey import AnswerError, SurveyError
    from veil.trust import TrustError

    name = "veil survey respond"
    setup_logging(args.log_level)
    if args.invitations is not None:
        return _respond_panel(args, name)
    try:
        client = SurveyClient(
            args.survey_dir,
            invitation=args.invitation,
            issuer=args.issuer,
            issuer_keys=args.issuer_keys,
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
        )
    except (OSError, SurveyError, TrustError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    with client:
        survey = client.survey
        try:
            if args.answer:
                if args.answers:
                    raise ValueError("give --answers FILE or --answer ID=ANSWER, not both")
                respondents, many = [("--answer", answers_from_options(survey, args.answer))], False
            elif args.answers:
                respondents, many = read_answers(Path(args.answers))
                for where, answers in respondents:
                    try:
                        client.measurements(answers)
                    except AnswerError as e:
                        raise ValueError(f"{where}: {e}") from None
            else:
                if not sys.stdin.isatty():
                    raise ValueError("give --answers FILE, or run it in a terminal to answer")
                client.check_open()
                respondents, many = [("terminal", _interactive(survey))], False
            if not any(a for _, a in respondents):
                raise ValueError("no answers given: nothing was sent")
            with tqdm(
                total=sum(len(client.measurements(a)) for _, a in respondents),
                desc="uploading",
                unit="report",
                # None: drawn only on a terminal, never into a log file.
                disable=True if not many or args.no_progress else None,
                file=sys.stderr,
            ) as bar:

                def advance(n: int) -> None:
                    bar.update(n)

                done = client.respond_many([a for _, a in respondents], on_progress=advance)
        except EOFError:
            print(f"\n{name}: stopped: nothing was sent", file=sys.stderr)
            return 1
        except (ValueError, SurveyError) as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 2
        except UploadError as e:
            print(f"{name}: upload failed: {e}", file=sys.stderr)
            return 1
        except InvitationError as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 1
    reports = sum(done.reports.values())
    who = "respondent" if done.respondents == 1 else "respondents"
    print(
        f"sent {reports} {'answer' if reports == 1 else 'answers'} of {done.respondents} {who}"
        f" to {survey.name!r} ({', '.join(f'{q}: {n}' for q, n in done.reports.items())})"
    )
    return 0


def read_codes(path: Path) -> list[tuple[int, str]]:
    """The invitation codes of a file, one a line (blank lines skipped), each
    with its line number; ValueError naming the file and line of a line that
    is not one code, or of a code given twice."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from None
    codes: list[tuple[int, str]] = []
    first: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        code = line.strip()
        if not code:
            continue
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", code):
            raise ValueError(
                f"{path}:{n}: not an invitation code (one code a line, as veil survey invite"
                f" writes them): {code[:40]!r}"
            )
        if code in first:
            raise ValueError(f"{path}:{n}: the same invitation code as line {first[code]}")
        first[code] = n
        codes.append((n, code))
    return codes


def _respond_panel(args: argparse.Namespace, name: str) -> int:
    """`--answers PANEL.jsonl --invitations CODES`: the n-th respondent of the
    panel answers with the n-th code, every line checked before anything is
    sent. An invitation already used (by an earlier run of the same command,
    say) is skipped and named: nothing is sent twice."""
    from tqdm import tqdm

    from veil.client import SurveyClient, UploadError
    from veil.invite.client import InvitationError
    from veil.invite.issuer import USED_MESSAGE
    from veil.survey import AnswerError, SurveyError
    from veil.trust import TrustError

    try:
        if args.invitation is not None or args.answer:
            raise ValueError(
                "--invitations answers a panel from --answers: not with --invitation or --answer"
            )
        if not args.answers or args.issuer is None:
            raise ValueError(
                "--invitations needs --answers PANEL.jsonl (one respondent a line, the n-th"
                " answering with the n-th code) and --issuer URL"
            )
        respondents, many = read_answers(Path(args.answers))
        if not many:
            raise ValueError(f"{args.answers}: a panel is a .jsonl file, one respondent a line")
        codes = read_codes(Path(args.invitations))
        if len(codes) != len(respondents):
            raise ValueError(
                f"{args.answers} has {len(respondents)} respondents and {args.invitations}"
                f" {len(codes)} invitation codes: give one code a respondent, in the same order"
                " (nothing was sent)"
            )
        if not codes:
            raise ValueError("no answers given: nothing was sent")
        client = SurveyClient(
            args.survey_dir,
            invitation=codes[0][1],
            issuer=args.issuer,
            issuer_keys=args.issuer_keys,
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
        )
    except (OSError, ValueError, SurveyError, TrustError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    used: list[str] = []
    sent = 0
    reports: dict[str, int] = {}
    with client:
        try:
            for where, answers in respondents:
                try:
                    client.measurements(answers)
                except AnswerError as e:
                    raise ValueError(f"{where}: {e}") from None
            client.check_open()
        except (ValueError, SurveyError) as e:
            print(f"{name}: {e} (nothing was sent)", file=sys.stderr)
            return 2
        at = ""
        try:
            with tqdm(
                total=len(respondents),
                desc="answering",
                unit="respondent",
                disable=True if args.no_progress else None,
                file=sys.stderr,
            ) as bar:
                for (where, answers), (line, code) in zip(respondents, codes, strict=True):
                    at = where
                    try:
                        done = client.respond_invited(answers, code)
                    except InvitationError as e:
                        if USED_MESSAGE not in str(e):
                            raise
                        used.append(f"{args.invitations}:{line}")
                    else:
                        sent += 1
                        for q, n in done.reports.items():
                            reports[q] = reports.get(q, 0) + n
                    bar.update(1)
        except (InvitationError, UploadError, SurveyError) as e:
            print(
                f"{name}: {at}: {e}; the {sent} respondents before it were answered. Run the"
                " same command again for the rest: an invitation already used is skipped, never"
                " sent twice (this respondent's too, if the issuer took its invitation)",
                file=sys.stderr,
            )
            return 1
    answered = ", ".join(f"{q}: {n}" for q, n in reports.items())
    print(
        f"answered {sent} of {len(respondents)} invited respondents to"
        f" {client.survey.name!r}" + (f" ({answered})" if answered else "")
    )
    if used:
        print(
            f"{len(used)} {'invitation was' if len(used) == 1 else 'invitations were'} already"
            f" used, so {'its respondent was' if len(used) == 1 else 'their respondents were'}"
            " skipped"
            f" (nothing sent twice): {', '.join(used[:10])}{' ...' if len(used) > 10 else ''}"
        )
    return 0


def _interactive(survey: Survey) -> dict[str, Any]:
    from veil.times import format_time

    assert survey.closes is not None
    print(f"{survey.name} (open until {format_time(survey.closes)})")
    print("Answer each question; leave one empty to skip it. Nothing is sent before you confirm.")
    answers = ask(survey, input, print)
    if not answers:
        return answers
    print("\nYour answers:")
    for q in survey.questions:
        if q.id in answers:
            print(f"  {q.text}: {_show(q, answers[q.id])}")
    if input("Send these answers? [y/N] > ").strip().lower() not in ("y", "yes"):
        raise EOFError
    return answers


def register(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    survey: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    p = survey.add_parser(
        "respond",
        help="answer a survey by label (from a file, or question by question on the terminal)",
        description=(
            "Answer a deployed survey. Answers are given by label: yes_no as yes/no/true/false,"
            " integer as a number, choice as an option name, multi_choice as a list of option"
            " names, vector as a list of numbers, points as a table of option names to points"
            " (at most the question's total in all; an option left out gets 0), text as a"
            " string (trimmed and, unless the question is case-sensitive, lower-cased). FILE is"
            " one respondent (.toml or .json: an object keyed by question id) or many (.jsonl:"
            " one object a line). --answer ID=ANSWER gives one question's answer as the"
            " terminal takes it (remote=yes, tools=chat,wiki, ratings=3,7,5,"
            " budget=training:40,tools:60), one --answer per question. A question left out is"
            " not answered. Every answer is checked before anything is sent."
        ),
    )
    p.add_argument(
        "--survey-dir", required=True, help="the client/ directory of the survey's deployment"
    )
    p.add_argument("--answers", metavar="FILE", help="answers file (default: ask on the terminal)")
    p.add_argument(
        "--answer",
        action="append",
        metavar="ID=ANSWER",
        help="one question's answer as the terminal takes it, e.g. --answer remote=yes or"
        " --answer budget=training:40,tools:60 (points: option:points pairs); repeat per question",
    )
    p.add_argument(
        "--invitation", metavar="CODE", help="your invitation code (a survey with invitations)"
    )
    p.add_argument(
        "--invitations",
        metavar="FILE",
        help="a panel with invitations: the codes, one a line, as veil survey invite writes"
        " them; the n-th respondent of --answers (a .jsonl file) answers with the n-th code",
    )
    p.add_argument(
        "--issuer",
        metavar="URL",
        help="the issuer's address, e.g. https://survey.example/invitation (with --invitation"
        " or --invitations)",
    )
    p.add_argument(
        "--issuer-keys",
        metavar="FINGERPRINT",
        help="the fingerprint of the survey's issuer keys as the survey published it: the"
        " client files' keys are checked against it before the invitation is redeemed",
    )
    _trust_arguments(p)
    add_retired_ca(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-level", default="warning", help="log level (default warning)")
    p.set_defaults(func=cmd_survey_respond)

    p = commands.add_parser("upload", help="upload measurements of one task")
    p.add_argument("--task", required=True, help="the client's task file")
    p.add_argument("values", nargs="*", help="measurements, e.g. 1, 42 or 1,0,3")
    p.add_argument("--file", help="a file with one measurement per line")
    p.add_argument("--time", type=int, help="report time (default: now)")
    _connection_arguments(p)
    add_retired_ca(p)
    p.add_argument(
        "--outbox",
        metavar="PATH",
        help="keep each sealed report in this SQLite file until the leader acknowledged it"
        " (created with mode 0600); what the leader did not take waits for `veil outbox flush`",
    )
    p.add_argument(
        "--outbox-max",
        type=_positive,
        metavar="N",
        help=f"reports the outbox may hold (default {OUTBOX_MAX_REPORTS})",
    )
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_upload)

    outbox = commands.add_parser(
        "outbox", help="reports kept by `veil upload --outbox`"
    ).add_subparsers(dest="outbox_command", required=True)
    f = outbox.add_parser("flush", help="send the pending reports of a task to its leader")
    f.add_argument("--outbox", required=True, metavar="PATH", help="the outbox file")
    f.add_argument("--task", required=True, help="the client's task file")
    _connection_arguments(f)
    f.add_argument("--log-level", default="warning")
    f.set_defaults(func=cmd_outbox_flush)
    st = outbox.add_parser("status", help="what the outbox holds, per task (no network)")
    st.add_argument("--outbox", required=True, metavar="PATH", help="the outbox file")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=cmd_outbox_status)

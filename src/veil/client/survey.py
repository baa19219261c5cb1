"""Answering a deployed survey by label: `SurveyClient`.

It reads the deployment's client/ directory (``survey.json``, veil.survey.description,
and one task file per question), turns each answer into its question's
measurement (`veil.survey.Question.to_measurement`) and uploads one report per
answered question with `veil.client.Client` (`DapClient` for a survey deployed
over DAP, whose tasks have a [dap] table). A breakdown is answered from the
answers already given: one more report, under its own task, whenever both its
question and its group question are answered (`Question.breakdown_measurement`).
A question with a local layer (`local_epsilon`) is randomized once on this
device (`device_measurements`): its report and its breakdowns send that one
randomized answer, never the true one nor a second draw.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veil.client.base import ClientOptions
from veil.client.client import Client
from veil.client.dap import DapClient, InvitedReport, client_for
from veil.client.prepare import prepare_reports, randomize_measurements
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.messages import Report
from veil.survey.answers import AnswerError
from veil.survey.description import load_description
from veil.survey.model import Question, Survey, SurveyError
from veil.task import ClientTask
from veil.times import format_duration, format_time

UPLOAD_CHUNK = 500


class WindowClosed(SurveyError):
    """The survey is not open at this time (not yet, or no longer)."""


@dataclass(frozen=True)
class Responses:
    """What `SurveyClient.respond`/`respond_many` uploaded: reports per question
    (a question nobody answered is absent) and how many respondents."""

    respondents: int
    reports: Mapping[str, int]


class SurveyClient:
    """Answers a deployed survey by label, for one respondent or many.

    `directory` is the deployment's client/ directory (survey.json and one
    task file per question). Answers are a mapping from question id to the
    answer in the question's terms (`Question.to_measurement`); a question
    left out is not uploaded. Every answer is checked before anything is
    sent. The TLS options are those of `veil.client.Client`.

    A report's time is now, rounded down to the time precision; outside the
    window the call raises WindowClosed before sending anything.

    A survey with invitations (`invitations = true`) takes answers from one
    invited respondent: give `invitation` (the code) and `issuer` (the URL
    of the issuer's POST /invitation endpoint). `respond` then redeems the
    invitation for one token per question (veil.invite.client) before it
    sends anything; a used invitation raises InvitationError ("This
    invitation has already been used."). With `issuer_keys`, the survey's
    published fingerprint of its issuer keys (veil.invite.token.keys_fingerprint,
    printed by `veil survey deploy` and `veil survey invite`), the keys in
    the client files are checked against it first: a SurveyError names both
    fingerprints when they differ, and nothing is redeemed or sent.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        invitation: str | None = None,
        issuer: str | None = None,
        issuer_keys: str | None = None,
        leader_root_certificates: bytes | None = None,
        helper_root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.description = load_description(directory)
        self.survey = self.description.survey
        self.clock = clock
        if self.survey.invitations and (invitation is None or issuer is None):
            raise SurveyError(
                "this survey takes answers from invited respondents only: give the invitation"
                " code and the issuer's address (veil survey respond --invitation CODE"
                " --issuer URL; in Python SurveyClient(..., invitation=CODE, issuer=URL))"
            )
        if not self.survey.invitations and invitation is not None:
            raise SurveyError("this survey does not use invitations")
        self.invitation = invitation
        self.issuer = issuer
        self.tasks: dict[str, ClientTask] = self.description.load_tasks()
        self.issuer_keys: str | None = None
        if self.survey.invitations:
            self.issuer_keys = _issuer_keys(self.survey.tasked, self.tasks, issuer_keys)
        elif issuer_keys is not None:
            raise SurveyError("this survey does not use invitations: it has no issuer keys")
        # Channels connect on first use; creating them here checks the
        # certificates (veil.trust.TrustError) before any answer is taken.
        self._clients: dict[str, Client | DapClient] = {}
        options = ClientOptions(
            leader_root_certificates=leader_root_certificates,
            helper_root_certificates=helper_root_certificates,
            private_key=private_key,
            certificate_chain=certificate_chain,
        )
        dap = [qid for qid, task in self.tasks.items() if task.dap is not None]
        if dap and (private_key is not None or certificate_chain is not None):
            raise SurveyError(
                "this survey is served over DAP, whose uploads name no client certificate:"
                " leave out the client certificate and key"
            )
        try:
            for qid, task in self.tasks.items():
                # Over DAP for a task with a [dap] table (`veil survey deploy --protocol dap`).
                self._clients[qid] = client_for(task, options)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close every task's client."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> SurveyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_open(self) -> int:
        """The report time for now; WindowClosed outside [opens, closes)."""
        assert self.survey.opens is not None and self.survey.closes is not None
        now = int(self.clock())
        if now < self.survey.opens:
            raise WindowClosed(
                f"the survey opens at {format_time(self.survey.opens)}, in"
                f" {format_duration(self.survey.opens - now)}: nothing was sent"
            )
        if now >= self.survey.closes:
            raise WindowClosed(
                f"the survey closed at {format_time(self.survey.closes)}: nothing was sent"
            )
        return now - now % self.survey.time_precision

    def measurements(self, answers: Any) -> dict[str, Any]:
        """Each answered question's measurement, and each breakdown's whose two
        questions are answered (by its id); AnswerError on any bad answer."""
        if not isinstance(answers, Mapping):
            raise AnswerError(
                f"answers must be an object keyed by question id, got {type(answers).__name__}"
            )
        ids = [q.id for q in self.survey.questions]
        unknown = [k for k in answers if k not in ids]
        if unknown:
            raise AnswerError(
                f"{unknown[0]!r} is not a question of this survey; its questions are"
                f" {', '.join(ids)}"
            )
        missing = [q for q in self.survey.questions if q.required and answers.get(q.id) is None]
        if missing:
            raise AnswerError(
                f"question {missing[0].id!r} needs an answer (the survey marks it required);"
                f" give {missing[0].allowed()}"
            )
        out = {
            q.id: q.to_measurement(answers[q.id])
            for q in self.survey.questions
            if q.id in answers and answers[q.id] is not None
        }
        for b in self.survey.breakdowns:
            assert b.of is not None and b.by is not None
            if b.of.id in out and b.by.id in out:
                out[b.id] = b.breakdown_measurement(out[b.of.id], out[b.by.id])
        return out

    def respond(self, answers: Mapping[str, Any]) -> Responses:
        """Upload one respondent's answers (one report per answered question)."""
        return self.respond_many([answers])

    def respond_many(
        self,
        respondents: Iterable[Mapping[str, Any]],
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> Responses:
        """Upload many respondents' answers: all are checked first (AnswerError
        names the respondent, counting from 1), then each question's reports go
        up in batches. `on_progress` is called with the number of reports sent
        by each batch."""
        per_question: dict[str, list[Any]] = {q.id: [] for q in self.survey.tasked}
        count = 0
        randomized: set[str] = set()
        for n, answers in enumerate(respondents, 1):
            try:
                device, drawn = device_measurements(
                    self.survey, self.tasks, self.measurements(answers)
                )
            except (AnswerError, ValueError) as e:
                raise AnswerError(f"respondent {n}: {e}") from None
            for qid, m in device.items():
                per_question[qid].append(m)
            randomized |= drawn
            count += 1
        report_time = self.check_open()
        if self.survey.invitations:
            assert self.invitation is not None
            return self._respond_invited(
                per_question, count, report_time, on_progress, randomized, self.invitation
            )
        sent: dict[str, int] = {}
        for qid, ms in per_question.items():
            if not ms:
                continue
            client = self._clients[qid]
            for i in range(0, len(ms), UPLOAD_CHUNK):
                chunk = ms[i : i + UPLOAD_CHUNK]
                client.upload_batch(chunk, report_time, randomized=qid in randomized)
                sent[qid] = sent.get(qid, 0) + len(chunk)
                if on_progress is not None:
                    on_progress(len(chunk))
        return Responses(count, sent)

    def respond_invited(
        self,
        answers: Mapping[str, Any],
        invitation: str,
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> Responses:
        """Upload one invited respondent's answers under `invitation`, the
        code given to that respondent (a panel answers each of its
        respondents so, each with its own code, through one client: `veil
        survey respond --invitations`). InvitationError as `respond`."""
        if not self.survey.invitations:
            raise SurveyError("this survey does not use invitations")
        per_question: dict[str, list[Any]] = {q.id: [] for q in self.survey.tasked}
        try:
            device, randomized = device_measurements(
                self.survey, self.tasks, self.measurements(answers)
            )
        except ValueError as e:
            raise AnswerError(str(e)) from None
        for qid, m in device.items():
            per_question[qid].append(m)
        report_time = self.check_open()
        return self._respond_invited(
            per_question, 1, report_time, on_progress, randomized, invitation
        )

    def _respond_invited(
        self,
        per_question: Mapping[str, list[Any]],
        count: int,
        report_time: int,
        on_progress: Callable[[int], None] | None,
        randomized: set[str],
        invitation: str,
    ) -> Responses:
        """One invited respondent: each answered question's report sealed (a
        DAP report made ready to seal: its token is inside what it is sealed
        with, veil.dap.invitation), a token redeemed for each (bound to it),
        then sent."""
        from veil.invite.client import redeem_tokens
        from veil.invite.token import report_context

        if count != 1:
            raise AnswerError("an invitation is for one respondent: give one set of answers")
        assert self.issuer is not None
        qids = [q.id for q in self.survey.tasked]
        ready: dict[str, Report | InvitedReport] = {}
        contexts: list[bytes | None] = []
        for qid in qids:
            ms = per_question.get(qid)
            if not ms:
                contexts.append(None)
                continue
            client = self._clients[qid]
            if isinstance(client, DapClient):
                (m,) = ms
                invited = client.prepare_invited(m, report_time, randomized=qid in randomized)
                ready[qid] = invited
                contexts.append(invited.context)
                continue
            (report,) = prepare_reports(
                self.tasks[qid],
                ms,
                client.hpke_config(ROLE_LEADER),
                client.hpke_config(ROLE_HELPER),
                report_time,
                invited=True,
                randomized=qid in randomized,
            )
            ready[qid] = report
            contexts.append(report_context(self.tasks[qid].task_id, report))
        tokens = redeem_tokens(self.issuer, invitation, [self.tasks[q] for q in qids], contexts)
        sent: dict[str, int] = {}
        for qid, token in zip(qids, tokens, strict=True):
            prepared = ready.get(qid)
            if prepared is None or token is None:
                continue
            client = self._clients[qid]
            if isinstance(prepared, InvitedReport):
                assert isinstance(client, DapClient)
                client.upload_invited(prepared, token)
            else:
                assert isinstance(client, Client)
                client.upload_reports([dataclasses.replace(prepared, token=token)])
            sent[qid] = 1
            if on_progress is not None:
                on_progress(1)
        return Responses(count, sent)


def device_measurements(
    survey: Survey, tasks: Mapping[str, ClientTask], measured: Mapping[str, Any]
) -> tuple[dict[str, Any], set[str]]:
    """What one respondent's device sends: `measured` (each answered question's
    measurement) with every question that has a local layer randomized once by its
    task's channel, and each breakdown whose two questions are answered made from
    those (randomized) measurements; and the ids whose measurements were drawn here
    (to be sent as they are: `prepare_reports(..., randomized=True)`)."""
    out = {q.id: measured[q.id] for q in survey.questions if q.id in measured}
    drawn: set[str] = set()
    for q in survey.questions:
        if q.id in out and tasks[q.id].dp.local(tasks[q.id].vdaf) is not None:
            (out[q.id],) = randomize_measurements(tasks[q.id], [out[q.id]])
            drawn.add(q.id)
    for b in survey.breakdowns:
        assert b.of is not None and b.by is not None
        if b.of.id in out and b.by.id in out:
            out[b.id] = b.breakdown_measurement(out[b.of.id], out[b.by.id])
    return out, drawn


def _issuer_keys(
    questions: Sequence[Question], tasks: Mapping[str, ClientTask], published: str | None
) -> str:
    """The fingerprint of the issuer keys in `tasks` (question order);
    SurveyError unless it is `published` (where given)."""
    from veil.invite.token import TokenError, keys_fingerprint, normalise_keys_fingerprint

    ders = []
    for q in questions:
        key = tasks[q.id].issuer_public_key
        if key is None:
            raise SurveyError(f"question {q.id!r}: its task file has no issuer key")
        ders.append(key)
    got = keys_fingerprint(ders)
    if published is None:
        return got
    try:
        want = normalise_keys_fingerprint(published)
    except TokenError as e:
        raise SurveyError(str(e)) from None
    if got != want:
        raise SurveyError(
            f"the issuer keys in these client files have the fingerprint {got}, not the"
            f" survey's published {want}: keys given to you alone could mark your answers."
            " Nothing was sent and the invitation is unused; tell the survey's operator"
        )
    return got

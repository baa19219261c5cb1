"""A respondent's side of invitations: blind one token per question for
the report already sealed for it, have the issuer sign them for an
invitation (POST /invitation, veil.invite.http), and unblind.

The reports are sealed before issuance because each token's challenge
commits to its report's content (veil.invite.token.report_context): the
token is good for that report as sealed and no other.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Protocol

from veil.invite import blindrsa
from veil.invite.token import PendingToken, report_context
from veil.messages import Report


class InvitedTask(Protocol):
    """What redeeming needs of a task (a `veil.task.ClientTask` has it); said
    here so that invitations, which `veil.task` reads issuer keys with, do
    not import the tasks back."""

    @property
    def task_id(self) -> bytes: ...

    @property
    def id_text(self) -> str: ...

    @property
    def issuer_public_key(self) -> bytes | None: ...


class InvitationError(Exception):
    """The issuer refused the invitation (the message is the issuer's) or
    could not be reached."""


# The issuer's answers that say "not now" rather than "no": the invitation
# was not used (a 5xx decides nothing; a used invitation answers its own
# blinded messages again), so the same request may be sent again.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 30.0


def _retry_after(value: str | None) -> float | None:
    """The seconds of a Retry-After header given as a number, else None."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    if seconds is None or not 0 <= seconds < float("inf"):
        return None
    return min(seconds, MAX_RETRY_AFTER)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def redeem(
    issuer_url: str,
    code: str,
    tasks: Sequence[InvitedTask],
    reports: Sequence[Report | None],
    timeout: float = 30.0,
    attempts: int = 3,
    backoff: float = 0.5,
) -> list[Report | None]:
    """Each of `reports` (one per task, in order: the report sealed for that
    task's question, or None for a question left unanswered) with its token,
    for invitation `code`; raises InvitationError.

    The issuer signs one token per question: a question left unanswered
    gets one bound to nothing (a random context), dropped here. A request
    that fails on the way, or that the issuer answers with a transient
    error (TRANSIENT_STATUSES), is sent again as it was (`attempts` in all,
    after the issuer's Retry-After where it gives one), so an answer lost
    after the issuer burnt the invitation is not a lost invitation."""
    if len(reports) != len(tasks):
        raise ValueError("one report (or None) per task")
    contexts = [
        None if report is None else report_context(task.task_id, report)
        for task, report in zip(tasks, reports, strict=True)
    ]
    tokens = redeem_tokens(issuer_url, code, tasks, contexts, timeout, attempts, backoff)
    return [
        None if report is None or token is None else dataclasses.replace(report, token=token)
        for report, token in zip(reports, tokens, strict=True)
    ]


def redeem_tokens(
    issuer_url: str,
    code: str,
    tasks: Sequence[InvitedTask],
    contexts: Sequence[bytes | None],
    timeout: float = 30.0,
    attempts: int = 3,
    backoff: float = 0.5,
) -> list[bytes | None]:
    """`redeem` for redemption contexts (one per task, in order; None for a
    question left unanswered): each context's token. A DAP report's context
    commits to what it will be sealed with, before it is (veil.dap.invitation)."""
    if len(contexts) != len(tasks):
        raise ValueError("one context (or None) per task")
    pending = []
    for task, context in zip(tasks, contexts, strict=True):
        if task.issuer_public_key is None:
            raise InvitationError(f"task {task.id_text} takes no invitation token")
        pending.append(
            PendingToken.start(
                task.issuer_public_key, secrets.token_bytes(32) if context is None else context
            )
        )
    body = json.dumps(
        {"invitation": code, "blinded": [_b64(p.blinded_msg) for p in pending]}
    ).encode()
    request = urllib.request.Request(
        issuer_url, body, {"Content-Type": "application/json"}, method="POST"
    )
    # The same request again when the answer is lost on the way: the issuer
    # answers a used invitation's own blinded messages with the same signatures.
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                answer = json.loads(response.read(64 * 1024))
            break
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read(4096))["error"]
            except (ValueError, KeyError, TypeError, OSError):
                message = f"the issuer answered HTTP {e.code}"
            if e.code not in TRANSIENT_STATUSES or attempt + 1 == attempts:
                raise InvitationError(str(message)) from None
            wait = _retry_after(e.headers.get("Retry-After") if e.headers else None)
            time.sleep(backoff * 2**attempt if wait is None else wait)
        except (urllib.error.URLError, OSError, ValueError) as e:
            if attempt + 1 == attempts:
                raise InvitationError(f"cannot reach the issuer at {issuer_url}: {e}") from None
            time.sleep(backoff * 2**attempt)
    sigs = answer.get("blind_signatures") if isinstance(answer, dict) else None
    if not isinstance(sigs, list) or len(sigs) != len(pending):
        raise InvitationError("the issuer's answer is malformed")
    out: list[bytes | None] = []
    for context, p, sig in zip(contexts, pending, sigs, strict=True):
        try:
            raw = base64.urlsafe_b64decode(str(sig) + "=" * (-len(str(sig)) % 4))
            token = p.finish(raw)
        except (ValueError, blindrsa.BlindRSAError) as e:
            raise InvitationError(f"the issuer's signature is invalid: {e}") from None
        out.append(None if context is None else token)
    return out

"""Each task as an aggregator serves it, built once when the task is added:
the one place that looks at the task's kind of VDAF.

A `TaskContext` holds what every part of the leader and the helper needs of
a task: the VDAF as an `Engine` (veil.vdaf.engine: the same calls for
Prio3 and Poplar1), the exact sizes of its reports, the bounds of its
aggregates, and, for a VDAF queried with an aggregation parameter, the rules
on those queries (`queries`). That is the one real difference between the
kinds a part ever asks about: where a task's aggregation jobs come from,
stored uploads (Prio3, `queries` None) or a collection's query of one level
(Poplar1). `TaskTable` is an aggregator's tasks and their contexts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from veil.aggregator.errors import UnknownTask, WrongLength
from veil.aggregator.prefixes import PrefixVdaf
from veil.dap.invitation import INVITATION_DATA_SIZE
from veil.dp import DPError
from veil.dp.bounds import AggregateBounds
from veil.hpke import AEAD_TAG_SIZE, ENC_SIZE, Ciphertext
from veil.messages import REPORT_ID_SIZE
from veil.task import AggregatorTask, Task, TaskError, b64e, expect_role
from veil.vdaf import Poplar1, Prio3
from veil.vdaf.batch.prio3 import BatchPrio3
from veil.vdaf.engine import Engine, Poplar1Engine, Prio3Engine

AT = TypeVar("AT", bound=AggregatorTask)


@dataclass(frozen=True)
class ReportSizes:
    """The exact sizes of a report's parts for one task: its VDAF fixes the
    public share and input shares, the HPKE suite (X25519, AES-128-GCM) the
    encapsulated key and the tag added to each sealed share. An upload of any
    other size is refused before anything is stored: a report padded beyond
    them would only cost storage and make aggregation jobs too large to send
    (issue 13)."""

    public_share: int
    leader_payload: int
    helper_payload: int
    verifier_share: int
    enc: int = ENC_SIZE

    @staticmethod
    def of(vdaf: Prio3[Any, Any], wrapping: int = 0, leader_extra: int = 0) -> ReportSizes:
        """The sizes for `vdaf` (a task with invitations the same: its token
        travels beside the report, not in a share); a task served over DAP
        seals each input share inside a PlaintextInputShare of `wrapping`
        bytes more (`DAP_WRAPPING`), and the leader's holds `leader_extra`
        more where its private extensions carry the token
        (`Task.invitation_private`)."""
        return ReportSizes(
            public_share=vdaf.public_share_size(),
            leader_payload=vdaf.input_share_size(0) + wrapping + leader_extra + AEAD_TAG_SIZE,
            helper_payload=vdaf.input_share_size(1) + wrapping + AEAD_TAG_SIZE,
            verifier_share=vdaf.verifier_share_size(),
        )

    @staticmethod
    def of_poplar1(vdaf: Poplar1) -> ReportSizes:
        """The sizes for a Poplar1 task (its verifier shares: at most three
        elements of the leaf's 32-byte field)."""
        return ReportSizes(
            public_share=vdaf.public_share_size(),
            leader_payload=vdaf.input_share_size(0) + AEAD_TAG_SIZE,
            helper_payload=vdaf.input_share_size(1) + AEAD_TAG_SIZE,
            verifier_share=3 * vdaf.idpf.field_leaf.ENCODED_SIZE,
        )

    def job_item_bytes(self) -> int:
        """An upper bound on one report's bytes in an aggregation job request:
        id, time, public share, sealed helper share, the leader's verifier
        share, and protobuf framing (generously: a tag and a length per field)."""
        payload = REPORT_ID_SIZE + 8 + self.public_share + self.enc + self.helper_payload
        return payload + self.verifier_share + 64

    def check(self, public_share: bytes, leader: Ciphertext, helper: Ciphertext) -> None:
        """Raises WrongLength naming the first part whose size is not exact."""
        for name, got, want in (
            ("public_share", len(public_share), self.public_share),
            ("leader_encrypted_input_share.enc", len(leader.enc), self.enc),
            ("leader_encrypted_input_share.payload", len(leader.payload), self.leader_payload),
            ("helper_encrypted_input_share.enc", len(helper.enc), self.enc),
            ("helper_encrypted_input_share.payload", len(helper.payload), self.helper_payload),
        ):
            if got != want:
                raise WrongLength(f"{name} is {got} bytes; this task's is exactly {want} bytes")


class TaskLimitError(ValueError):
    """A task whose noise or field cannot hold a batch of min_batch_size reports."""


def task_bounds(task: Task) -> AggregateBounds:
    """The task's aggregate bounds (veil.dp.bounds); TaskLimitError if even a batch
    of min_batch_size reports could wrap around the field."""
    try:
        bounds = task.dp.bounds(task.vdaf)
        bounds.check_batch_floor(task.min_batch_size)
    except (TaskError, DPError) as e:
        raise TaskLimitError(f"task {task.id_text}: {e}") from None
    return bounds


# A DAP PlaintextInputShare with no private extension: an empty extension
# list (2 bytes of length) and the input share's 4-byte length before it.
DAP_WRAPPING = 2 + 4
# veil's invitation extension encoded (type, data length, data), where the
# leader's share holds it.
INVITATION_EXTENSION_BYTES = 2 + 2 + INVITATION_DATA_SIZE


@dataclass(frozen=True)
class TaskContext(Generic[AT]):
    """One task as this aggregator serves it (see the module)."""

    task: AT
    engine: Engine
    sizes: ReportSizes
    bounds: AggregateBounds
    # A VDAF queried with an aggregation parameter (Poplar1): the rules on
    # its queries, and its jobs come from a collection's query of a level.
    # None: the parameter is empty and the jobs come from stored uploads.
    queries: PrefixVdaf | None = None

    @property
    def by_query(self) -> bool:
        """Whether the task's jobs come from a collection's query."""
        return self.queries is not None

    @staticmethod
    def of(task: AT) -> TaskContext[AT]:
        """The task's context; TaskLimitError if its noise or field cannot
        hold a batch of min_batch_size reports (refused here, before serving,
        rather than after a collection has spent budget)."""
        bounds = task_bounds(task)
        if task.vdaf.is_prefix:
            queries = PrefixVdaf.of(task)
            return TaskContext(
                task,
                Poplar1Engine(queries.batch),
                ReportSizes.of_poplar1(queries.vdaf),
                bounds,
                queries,
            )
        vdaf = task.vdaf.instantiate()
        # The batched (NumPy) path verifies a whole job at once; it agrees
        # with the scalar path report by report.
        wrapping = DAP_WRAPPING if task.dap is not None else 0
        return TaskContext(
            task,
            Prio3Engine(BatchPrio3(vdaf)),
            ReportSizes.of(
                vdaf, wrapping, INVITATION_EXTENSION_BYTES if task.invitation_private else 0
            ),
            bounds,
        )


class TaskTable(Generic[AT]):
    """The tasks one aggregator serves, each with its context. Tasks are
    added (at start, and on SIGHUP), never removed, and changed only in
    their window (on SIGHUP): a reader sees the old table or the new one,
    whole."""

    def __init__(self, role_name: str, task_type: type[AggregatorTask]) -> None:
        self.role_name = role_name
        self.task_type = task_type
        self.contexts: dict[bytes, TaskContext[AT]] = {}
        self.tasks: dict[bytes, AT] = {}

    def add(self, tasks: Mapping[bytes, AT]) -> list[TaskContext[AT]]:
        """Serve these tasks too; returns the new ones' contexts. A task
        already served must come back unchanged: task parameters are
        immutable."""
        new: dict[bytes, TaskContext[AT]] = {}
        for tid, t in tasks.items():
            expect_role(t, self.task_type, f"task {t.id_text}")
            known = self.tasks.get(tid)
            if known is not None:
                if known != t:
                    raise TaskError(
                        f"task {t.id_text} changed in its file; task parameters are"
                        " immutable (restart with a new task instead)"
                    )
                continue
            new[tid] = TaskContext.of(t)
        # Everything a request needs is in place before a task becomes
        # visible in `tasks`.
        self.contexts = {**self.contexts, **new}
        self.tasks = {**self.tasks, **{tid: c.task for tid, c in new.items()}}
        return list(new.values())

    def change_windows(self, tasks: Mapping[bytes, AT]) -> list[tuple[AT, AT]]:
        """Serve these tasks, each already served, with the window its file
        gives it now (a survey closed early or extended); any other change is
        refused, and then nothing changes. Returns (before, after) for each
        task whose window changed."""
        changed: dict[bytes, TaskContext[AT]] = {}
        pairs = []
        for tid, t in tasks.items():
            known = self.tasks.get(tid)
            if known is None or known == t:
                continue
            if not known.same_but_window(t):
                raise TaskError(
                    f"task {t.id_text} changed in its file beyond its window; a task's"
                    " parameters other than its window are immutable (restart with a new"
                    " task instead)"
                )
            changed[tid] = TaskContext.of(t)
            pairs.append((known, t))
        self.contexts = {**self.contexts, **changed}
        self.tasks = {**self.tasks, **{tid: c.task for tid, c in changed.items()}}
        return pairs

    def context(self, task_id: bytes) -> TaskContext[AT]:
        """The task's context; UnknownTask if this aggregator has no such task."""
        ctx = self.contexts.get(task_id)
        if ctx is None or task_id not in self.tasks:
            raise UnknownTask(
                f"unknown task id {b64e(task_id)} (base64url, as in task files): the"
                f" {self.role_name} has no such task; a task file added to its config after it"
                " started is loaded on SIGHUP (kill -HUP <pid>) or at restart"
            )
        return ctx

    def task(self, task_id: bytes) -> AT:
        return self.context(task_id).task

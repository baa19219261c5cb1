"""The leader's logic (draft-ietf-ppm-dap sections 4.4 to 4.6, leader side).

Uploads are checked and stored (`upload.py`; over DAP, `dap.py`); a driver (`Leader.run_once`,
called in a loop by the server's driver thread or by `veil worker`
processes) groups stored reports into aggregation jobs and completes each
with one round trip to the helper (`jobs.py`), then serves pending
collection jobs (`collection.py`). What the leader knows of the helper, its
API and its clock, is in `peer.py`; the driver's state between passes (stop,
helper unreachable, backoff) in `control.py`; what it counts in `meter.py`;
what it is built from in `settings.py`. `Leader` wires these together.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping, Sequence

from veil.aggregator.core import AggregatorBase
from veil.aggregator.errors import InvalidMessage
from veil.aggregator.leader.admission import Backlog
from veil.aggregator.leader.collection import CollectionDriver, TaskInfo, note_helper_away
from veil.aggregator.leader.control import Backoff
from veil.aggregator.leader.dap import DapUploads
from veil.aggregator.leader.dap_collections import DapCollections
from veil.aggregator.leader.jobs import JobDriver
from veil.aggregator.leader.meter import LeaderMeter
from veil.aggregator.leader.peer import HelperPeer
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.leader.skew import ClockWatch
from veil.aggregator.leader.upload import ReportWriter
from veil.aggregator.store.records import CollectionRecord
from veil.messages import Report, ReportBatch
from veil.task import LeaderTask, b64e


class Leader(AggregatorBase[LeaderTask]):
    """A leader: the tasks it serves, its keys, and its parts (the report
    writer, the job driver, the collection driver), built from `parts` and
    `settings`. Its `control` is what the loop that drives it reads."""

    role_name = "leader"
    task_type = LeaderTask

    def __init__(
        self,
        tasks: Mapping[bytes, LeaderTask],
        parts: LeaderParts,
        settings: LeaderSettings | None = None,
    ) -> None:
        settings = settings or LeaderSettings()
        self.settings = settings
        self.privacy = parts.privacy
        self.control = parts.control
        self.meter = LeaderMeter.of(parts.metrics)
        self.worker_id = (
            settings.worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        )
        # Each helper's clock against ours, read from every job's answer.
        self.clocks = ClockWatch(parts.store, parts.metrics)
        self.peer = HelperPeer(
            parts.helper, self.clocks, parts.clock, settings.max_helper_clock_lag
        )
        super().__init__(tasks, parts.store, parts.clock, parts.metrics, settings.open_threads)
        table, keys, store, clock = self.table, self.keys, parts.store, parts.clock
        self.jobs = JobDriver(
            table, keys, store, clock, self.peer, self.meter, self.control, settings, self.worker_id
        )
        self.writer = ReportWriter(
            table, keys, store, clock, self.peer, self.meter, settings.admission
        )
        self.dap = DapUploads(table, keys, self.writer, clock)
        self.collections = CollectionDriver(
            table,
            keys,
            store,
            clock,
            self.peer,
            parts.privacy,
            self.meter,
            self.control,
            Backoff(settings.retry_seconds, settings.max_retry_seconds),
            self.jobs.job_size,
        )
        self.dap_collections = DapCollections(self.dap, self.collections)

    @property
    def job_sizes(self) -> dict[bytes, int]:
        """Reports per aggregation job, per task (each served task's set)."""
        for task_id in self.tasks:
            self.jobs.job_size(task_id)
        return self.jobs.job_sizes

    @property
    def backlog(self) -> Backlog:
        """The reports waiting for aggregation, as uploads are admitted."""
        return self.writer.backlog

    # --- the client's and the collector's calls -------------------------------

    def upload(self, task_id: bytes, reports: Sequence[Report] | ReportBatch) -> tuple[int, int]:
        """Validate and store reports, all or nothing, if the backlog admits
        them (else Overloaded). Returns (stored, duplicates). A task served
        over DAP takes its reports over DAP only (`self.dap`)."""
        if self.table.task(task_id).dap is not None:
            raise InvalidMessage(
                f"task {b64e(task_id)} is served over DAP: upload its reports to the leader's"
                " DAP endpoint"
            )
        return self.writer.upload(task_id, reports)

    def create_collection(
        self,
        task_id: bytes,
        token: str | None,
        collection_id: bytes,
        start: int,
        duration: int,
        agg_param: bytes = b"",
    ) -> CollectionRecord:
        """A new collection job (or the known one); `agg_param` names a Poplar1
        task's level and prefixes (empty for Prio3). A task served over DAP
        is collected over DAP only (`self.dap_collections`)."""
        if self.table.task(task_id).dap is not None:
            raise InvalidMessage(
                f"task {b64e(task_id)} is served over DAP: collect it with a collection job at"
                " the leader's DAP endpoint"
            )
        return self.collections.create_collection(
            task_id, token, collection_id, start, duration, agg_param
        )

    def task_info(self, task_id: bytes, token: str | None) -> TaskInfo:
        """What the collector may know before collecting (the GetTaskInfo call)."""
        return self.collections.task_info(task_id, token)

    def get_collection(
        self, task_id: bytes, token: str | None, collection_id: bytes
    ) -> CollectionRecord:
        return self.collections.get_collection(task_id, token, collection_id)

    # --- the driver -------------------------------------------------------------

    def run_once(self) -> bool:
        """One pass of the driver: aggregation jobs, then collection jobs; True
        if it made progress. When the helper cannot be reached the pass ends
        there and `control.helper_unreachable` says so (the loop backs off)."""
        self.control.begin_pass()
        progress = self.jobs.run_pass()
        if self.control.helper_unreachable:
            note_helper_away(self.store, self.tasks.values(), self.control)
            return progress
        return progress | self.collections.run_pass(self.worker_id, self.settings.lease_seconds)

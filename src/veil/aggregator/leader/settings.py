"""What a leader is built from: its settings (the [driver] and [admission]
sections of its config) and the parts it works with (its store, the helper,
its privacy engine, clock and metrics, and the control its driver loop reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from veil.aggregator.leader.admission import AdmissionLimits
from veil.aggregator.leader.control import DriverControl
from veil.aggregator.leader.peer import HelperApi
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.metrics import Metrics

# The largest aggregation job request the leader builds, by default: well
# under the default max_message_bytes (16 MiB) of both servers, so a job is
# never refused for its size (issue 13: a job larger than the limit failed on
# every pass and blocked the jobs behind it).
MAX_JOB_BYTES = 4 << 20
# Failed attempts after which an aggregation job is given up (its reports
# rejected as job_failed); [driver] max_job_attempts.
DEFAULT_MAX_JOB_ATTEMPTS = 10
# Reports per aggregation job, and how long a worker holds a leased job before
# another may take it over ([driver] job_size and lease_seconds). A job costs
# each aggregator 3.5 to 6 ms of CPU whatever its size (its statements, the
# call, the batch's NumPy calls): 7 to 12 µs a report in jobs of 500, 2 to 3
# in jobs of 2,000 (docs/reports/SCALING.md, "The fixed cost of a job").
# Under light load jobs stay smaller: the driver takes what is pending.
DEFAULT_JOB_SIZE = 2000
DEFAULT_LEASE_SECONDS = 60.0
# How long after its time a report the helper finds too early (its clock
# behind the leader's) is still sent again, rather than rejected as
# report_too_early; [driver] max_helper_clock_lag. A collection waits for
# such reports, so at most this long past the end of its batch.
DEFAULT_MAX_HELPER_CLOCK_LAG = 3600.0


@dataclass(frozen=True)
class LeaderSettings:
    """How a leader drives its jobs and admits uploads.

    A failing aggregation job is given up after `max_job_attempts` failed
    attempts (Janus: maximum_attempts_before_failure); failed jobs and
    collections wait `retry_seconds`, doubling up to `max_retry_seconds`,
    before they are leased again, so they never hold up the others.
    `worker_id` names who holds a leased job (unique per driver, so two
    processes never mistake each other's leases for their own); None draws
    one from the host name, the process id and a random suffix.
    `open_threads` is the server's setting of that name: the threads a job's
    shares are opened over (0: one per core, at most four)."""

    job_size: int = DEFAULT_JOB_SIZE
    max_job_bytes: int = MAX_JOB_BYTES
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    max_job_attempts: int = DEFAULT_MAX_JOB_ATTEMPTS
    retry_seconds: float = 1.0
    max_retry_seconds: float = 300.0
    max_helper_clock_lag: float = DEFAULT_MAX_HELPER_CLOCK_LAG
    # Uploads are admitted while the reports waiting for aggregation are
    # within these limits (veil.aggregator.leader.admission).
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    worker_id: str | None = None
    open_threads: int = 0


@dataclass(frozen=True)
class LeaderParts:
    """What a leader works with: its store, the helper (a gRPC client in
    production), its privacy engine, its clock, its metrics (None: counted
    nowhere) and the control shared with the loop that drives it."""

    store: Datastore
    helper: HelperApi
    privacy: PrivacyEngine
    clock: Callable[[], float] = time.time
    metrics: Metrics | None = None
    control: DriverControl = field(default_factory=DriverControl)

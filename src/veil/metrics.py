"""Prometheus metrics for the aggregators.

We use ``prometheus_client``: it is the reference implementation of the
Prometheus text exposition format, has no further dependencies and serves
the format itself, which is all an aggregator needs; OpenTelemetry would
add an SDK and an exporter for the same output. Each server owns its own
``CollectorRegistry`` (never the global default), so several servers and
tests can live in one process. Metrics are off unless a port is configured.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.exposition import generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_PER_REPORT_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1)


class Metrics:
    """The metrics one aggregator exposes. ``role`` is "leader" or "helper"."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.registry = CollectorRegistry()
        r = self.registry
        self.reports_received = Counter(
            "veil_reports_received", "Reports received at upload.", ["task"], registry=r
        )
        self.reports_accepted = Counter(
            "veil_reports_accepted",
            "Reports that passed verification and were aggregated.",
            ["task"],
            registry=r,
        )
        self.reports_rejected = Counter(
            "veil_reports_rejected", "Reports rejected, by reason.", ["task", "reason"], registry=r
        )
        self.reports_deferred = Counter(
            "veil_reports_deferred",
            "Reports the helper found too early (its clock behind the leader's), counted"
            " each time: not rejected, the leader sends them again later.",
            ["task"],
            registry=r,
        )
        self.helper_clock_offset = Gauge(
            "veil_helper_clock_offset_seconds",
            "The helper's clock minus the leader's, measured from the helper's last"
            " aggregation job answer (positive: the helper is ahead). Leader only.",
            ["helper"],
            registry=r,
        )
        self.aggregation_jobs = Counter(
            "veil_aggregation_jobs",
            "Aggregation jobs completed, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.aggregation_job_seconds = Histogram(
            "veil_aggregation_job_seconds",
            "Wall time of one aggregation job.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.verify_seconds_per_report = Histogram(
            "veil_verify_seconds_per_report",
            "Verification time per report, averaged over a job.",
            buckets=_PER_REPORT_BUCKETS,
            registry=r,
        )
        # Poplar1 (text questions): its jobs run level by level inside a
        # collection, two rounds each, and are counted apart from Prio3's.
        # The level and the number of candidate prefixes are in the
        # aggregation parameter both servers receive.
        self.prefix_jobs = Counter(
            "veil_prefix_jobs",
            "Poplar1 aggregation jobs (one level's reports, two rounds), by outcome.",
            ["outcome"],
            registry=r,
        )
        self.prefix_job_seconds = Histogram(
            "veil_prefix_job_seconds",
            "Wall time of one Poplar1 aggregation job (the helper: its second round,"
            " which repeats the first when not cached).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefix_reports = Counter(
            "veil_prefix_reports",
            "Poplar1 reports verified at a level, by outcome (accepted or the rejection"
            " reason); a report is counted once per level it is queried at.",
            ["task", "level", "outcome"],
            registry=r,
        )
        self.prefix_levels = Counter(
            "veil_prefix_levels",
            "Poplar1 levels released or refused, by outcome.",
            ["task", "level", "outcome"],
            registry=r,
        )
        self.prefix_level_seconds = Histogram(
            "veil_prefix_level_seconds",
            "Wall time of one Poplar1 level's collection at the leader (all its jobs and"
            " the release).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefix_candidates = Gauge(
            "veil_prefix_candidates",
            "Candidate prefixes of the latest query of a Poplar1 task's level.",
            ["task", "level"],
            registry=r,
        )
        self.collections = Counter(
            "veil_collections", "Collections, by outcome.", ["task", "outcome"], registry=r
        )
        # Gaussian tasks count rho (zCDP), the others epsilon: the unit label says which.
        self.budget_spent = Gauge(
            "veil_budget_spent",
            "Privacy loss so far per task (and per survey, task label 'survey:<id>').",
            ["task", "unit"],
            registry=r,
        )
        self.budget_remaining = Gauge(
            "veil_budget_remaining",
            "Privacy budget one more collection over all reports could spend.",
            ["task", "unit"],
            registry=r,
        )
        self.requests_malformed = Counter(
            "veil_requests_malformed",
            "Requests refused because their bytes are not the method's message, by method.",
            ["method"],
            registry=r,
        )
        self.uploads_refused = Counter(
            "veil_uploads_refused",
            "Upload requests refused before storage (nothing stored), by reason.",
            ["task", "reason"],
            registry=r,
        )
        self.reports_duplicate = Counter(
            "veil_reports_duplicate",
            "Uploaded reports already stored with the same content (acknowledged again).",
            ["task"],
            registry=r,
        )
        self.hpke_opens = Counter(
            "veil_hpke_opens",
            "HPKE opens of input shares, by outcome (ok or the rejection reason).",
            ["outcome"],
            registry=r,
        )
        self.hpke_keys = Gauge(
            "veil_hpke_keys", "Stored HPKE keys, by state.", ["state"], registry=r
        )
        self.gc_deleted = Counter(
            "veil_gc_deleted_rows",
            "Rows deleted by garbage collection, by kind.",
            ["kind"],
            registry=r,
        )
        self.aggregation_jobs_open = Gauge(
            "veil_aggregation_jobs_open",
            "Aggregation jobs the leader has started and not finished.",
            registry=r,
        )
        self.reports_unaggregated = Gauge(
            "veil_reports_unaggregated",
            "Reports stored by the leader and not yet aggregated (the backlog).",
            ["task"],
            registry=r,
        )
        self.gc_runs = Counter("veil_gc_runs", "Garbage-collection passes.", registry=r)
        self.gc_seconds = Histogram(
            "veil_gc_seconds",
            "Wall time of one garbage-collection pass.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.storage_bytes = Gauge(
            "veil_storage_bytes", "Size of the aggregator's database.", registry=r
        )
        self.calls_unread = Counter(
            "veil_calls_unread",
            "Calls ended before their request was read (receive_timeout,"
            " too_many_waiting, unauthenticated) or read and dropped unserved"
            " (busy) (veil.aggregator.run.transport).",
            ["reason"],
            registry=r,
        )
        self.calls_waiting = Gauge(
            "veil_calls_waiting", "Calls now waiting for their requests.", registry=r
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def track_waiting(self, waiting: Callable[[], float]) -> None:
        """Report the calls waiting for their requests whenever metrics are scraped."""
        self.calls_waiting.set_function(waiting)

    def track_storage(self, size: Callable[[], float]) -> None:
        """Report the database size whenever metrics are scraped."""
        self.storage_bytes.set_function(size)

    def render(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        out: bytes = generate_latest(self.registry)
        return out

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on a separate port; returns the bound port."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server, self._thread = server, thread
        return int(server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

"""A durable outbox: sealed reports kept in a local SQLite file until the
leader has acknowledged them.

`Client(..., outbox=PATH)`, `AsyncClient(..., outbox=PATH)` and
`DapClient(..., outbox=PATH)` seal each report and commit it here *before*
sending it; a report leaves only when the leader acknowledged it. A
`ReportCodec` says how one kind of report is kept (veil's own, by default;
DAP's, `veil.client.dap.DapReports`), one kind per task. The leader
acknowledges a report id it already holds (with the same content) without
storing it again (draft-ietf-ppm-dap section 4.4.2), so a report sent, then
resent after the client was killed before it could delete it, is counted
once. Pending reports survive process restarts and leader outages;
`flush()` sends them.

The file holds only what the leader would see (sealed shares, report ids and
times) and the aggregators' public HPKE configs, so that a client restarted
during an outage can still seal new reports; it is created with mode 0600
all the same (a report's time and id are metadata about a respondent).

Writes use ``synchronous=FULL``: a report `add` returned for is on disk and
survives ``kill -9`` and power loss. One `Outbox` may be shared by threads;
several processes may share one file (SQLite's own locking), at worst
sending a report twice, which the leader acknowledges once.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar, overload

from google.protobuf.message import DecodeError

from veil.hpke import HpkeConfig
from veil.messages import Report
from veil.messages.wire import report_from_pb, report_to_pb
from veil.protocol.v1 import leader_pb2

#: Reports an outbox holds at most unless told otherwise (about 40 MB of
#: Count reports; a few times that for long vectors).
DEFAULT_MAX_REPORTS = 100_000

# SQLite's application_id of a veil outbox ("veio"): a file that is some
# other database is refused instead of having tables added to it.
_APPLICATION_ID = 0x7665696F
_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id BLOB NOT NULL, report_id BLOB NOT NULL, time INTEGER NOT NULL,
    report BLOB NOT NULL, stored REAL NOT NULL, refused TEXT,
    UNIQUE (task_id, report_id));
CREATE TABLE IF NOT EXISTS configs (
    task_id BLOB NOT NULL, role INTEGER NOT NULL, config_id INTEGER NOT NULL,
    public_key BLOB NOT NULL, kem_id INTEGER NOT NULL, kdf_id INTEGER NOT NULL,
    aead_id INTEGER NOT NULL, fetched REAL NOT NULL,
    PRIMARY KEY (task_id, role));
CREATE TABLE IF NOT EXISTS counters (
    task_id BLOB NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (task_id, name));
"""


R = TypeVar("R")


class ReportCodec(Protocol[R]):
    """How an outbox keeps one kind of sealed report."""

    def encode(self, report: R) -> bytes:
        """The report's bytes, as stored."""
        ...

    def decode(self, blob: bytes) -> R:
        """The report stored as `blob`; ValueError if it is not one."""
        ...

    def report_id(self, report: R) -> bytes: ...

    def time(self, report: R) -> int:
        """The report's time, in seconds since the epoch."""
        ...


class VeilReports:
    """veil's own reports (the gRPC protocol's), kept as their protobuf."""

    def encode(self, report: Report) -> bytes:
        return bytes(report_to_pb(report).SerializeToString())

    def decode(self, blob: bytes) -> Report:
        try:
            return report_from_pb(leader_pb2.Report.FromString(blob), "the report")
        except DecodeError as e:
            raise ValueError(str(e)) from None

    def report_id(self, report: Report) -> bytes:
        return report.report_id

    def time(self, report: Report) -> int:
        return report.time


class OutboxError(Exception):
    """The outbox file cannot be used (not an outbox, unreadable, damaged)."""


class OutboxFull(OutboxError):
    """Storing these reports would exceed the outbox's bound; nothing was stored."""


@dataclass(frozen=True)
class TaskStatus:
    """What an outbox holds for one task."""

    task_id: bytes
    pending: int  # sealed, not yet acknowledged by the leader
    refused: int  # refused by the leader for good; kept for inspection, never resent
    oldest: int | None  # report time of the oldest pending report
    delivered: int  # acknowledged and removed, over the outbox's life
    expired: int  # dropped unsent: older than the task's report_expiry_age


class Outbox(Generic[R]):
    """Sealed reports awaiting the leader's acknowledgement, in one SQLite file.
    `codec` says how they are kept (veil's own reports unless given).

    Raises OutboxError if `path` exists and is not a veil outbox. Example::

        with Outbox("reports.outbox") as box:
            box.add(task_id, reports)
            for seq, report in box.pending(task_id, 100):
                ...  # send, then
            box.acknowledge(task_id, [r.report_id for _, r in batch])
    """

    @overload
    def __init__(
        self: Outbox[Report],
        path: str | os.PathLike[str],
        max_reports: int = DEFAULT_MAX_REPORTS,
    ) -> None: ...

    @overload
    def __init__(
        self,
        path: str | os.PathLike[str],
        max_reports: int = DEFAULT_MAX_REPORTS,
        *,
        codec: ReportCodec[R],
    ) -> None: ...

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_reports: int = DEFAULT_MAX_REPORTS,
        *,
        codec: ReportCodec[R] | None = None,
    ) -> None:
        if max_reports < 1:
            raise ValueError("an outbox must hold at least one report")
        self.codec: ReportCodec[R] = codec or VeilReports()  # type: ignore[assignment]
        self.path = Path(path)
        self.max_reports = max_reports
        self._lock = threading.Lock()
        self._conn = _open(self.path)

    def close(self) -> None:
        """Close the file; what it holds stays there."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Outbox[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def add(self, task_id: bytes, reports: Sequence[R]) -> None:
        """Store sealed reports (all or none). Raises OutboxFull, storing
        nothing, if they do not fit. A report id already held is kept as it is."""
        codec = self.codec
        rows = [
            (task_id, codec.report_id(r), codec.time(r), codec.encode(r), time.time())
            for r in reports
        ]
        with self._tx() as conn:
            (held,) = conn.execute("SELECT COUNT(*) FROM reports").fetchone()
            if held + len(rows) > self.max_reports:
                raise OutboxFull(
                    f"outbox {self.path} is full: it holds {held} reports and its limit is"
                    f" {self.max_reports}; deliver them (veil outbox flush) once the leader"
                    " is reachable, or allow more (outbox_max_reports)"
                )
            conn.executemany(
                "INSERT OR IGNORE INTO reports (task_id, report_id, time, report, stored)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )

    def pending(self, task_id: bytes, limit: int, after: int = 0) -> list[tuple[int, R]]:
        """Up to `limit` pending reports, oldest stored first, with their
        sequence numbers (pass the last one as `after` to go on)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT seq, report FROM reports WHERE task_id = ? AND refused IS NULL"
                " AND seq > ? ORDER BY seq LIMIT ?",
                (task_id, after, limit),
            ).fetchall()
        out = []
        for seq, blob in rows:
            try:
                report = self.codec.decode(bytes(blob))
            except ValueError as e:
                raise OutboxError(f"outbox {self.path}: report {seq} is damaged: {e}") from None
            out.append((int(seq), report))
        return out

    def acknowledge(self, task_id: bytes, report_ids: Sequence[bytes]) -> None:
        """Remove reports the leader acknowledged (stored or already held)."""
        with self._tx() as conn:
            removed = 0
            for rid in report_ids:
                removed += conn.execute(
                    "DELETE FROM reports WHERE task_id = ? AND report_id = ?", (task_id, rid)
                ).rowcount
            _count(conn, task_id, "delivered", removed)

    def refuse(self, task_id: bytes, report_id: bytes, reason: str) -> None:
        """Mark a report the leader refused for good: kept, counted, never resent."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE reports SET refused = ? WHERE task_id = ? AND report_id = ?",
                (reason, task_id, report_id),
            )

    def drop_expired(self, task_id: bytes, horizon: int | None) -> int:
        """Delete pending reports with a time before `horizon` (the leader
        would refuse them as expired); returns how many."""
        if horizon is None:
            return 0
        with self._tx() as conn:
            n = conn.execute(
                "DELETE FROM reports WHERE task_id = ? AND refused IS NULL AND time < ?",
                (task_id, horizon),
            ).rowcount
            _count(conn, task_id, "expired", n)
        return int(n)

    def pending_count(self, task_id: bytes) -> int:
        """How many reports of the task wait to be sent."""
        with self._lock:
            (n,) = self._conn.execute(
                "SELECT COUNT(*) FROM reports WHERE task_id = ? AND refused IS NULL", (task_id,)
            ).fetchone()
        return int(n)

    def save_config(self, task_id: bytes, role: int, config: HpkeConfig, fetched: float) -> None:
        """Remember an aggregator's HPKE config, fetched at `fetched` (Unix time)."""
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO configs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    task_id,
                    role,
                    config.config_id,
                    config.public_key,
                    config.kem_id,
                    config.kdf_id,
                    config.aead_id,
                    fetched,
                ),
            )

    def config(self, task_id: bytes, role: int) -> tuple[HpkeConfig, float] | None:
        """The remembered HPKE config of an aggregator and when it was fetched."""
        with self._lock:
            row = self._conn.execute(
                "SELECT config_id, public_key, kem_id, kdf_id, aead_id, fetched FROM configs"
                " WHERE task_id = ? AND role = ?",
                (task_id, role),
            ).fetchone()
        if row is None:
            return None
        try:
            config = HpkeConfig(int(row[0]), bytes(row[1]), int(row[2]), int(row[3]), int(row[4]))
        except ValueError as e:
            raise OutboxError(f"outbox {self.path}: a stored HPKE config is damaged: {e}") from None
        return config, float(row[5])

    def status(self) -> list[TaskStatus]:
        """What the outbox holds, per task."""
        with self._lock:
            tasks = [
                bytes(t)
                for (t,) in self._conn.execute(
                    "SELECT task_id FROM reports UNION SELECT task_id FROM counters ORDER BY 1"
                )
            ]
            out = []
            for t in tasks:
                pending, refused, oldest = self._conn.execute(
                    "SELECT COUNT(*) FILTER (WHERE refused IS NULL),"
                    " COUNT(*) FILTER (WHERE refused IS NOT NULL),"
                    " MIN(time) FILTER (WHERE refused IS NULL)"
                    " FROM reports WHERE task_id = ?",
                    (t,),
                ).fetchone()
                counters = dict(
                    self._conn.execute(
                        "SELECT name, value FROM counters WHERE task_id = ?", (t,)
                    ).fetchall()
                )
                out.append(
                    TaskStatus(
                        t,
                        int(pending),
                        int(refused),
                        None if oldest is None else int(oldest),
                        int(counters.get("delivered", 0)),
                        int(counters.get("expired", 0)),
                    )
                )
        return out


def _count(conn: sqlite3.Connection, task_id: bytes, name: str, n: int) -> None:
    if n:
        conn.execute(
            "INSERT INTO counters VALUES (?, ?, ?)"
            " ON CONFLICT (task_id, name) DO UPDATE SET value = value + excluded.value",
            (task_id, name, n),
        )


def _open(path: Path) -> sqlite3.Connection:
    """Open (creating with mode 0600) and check the outbox file."""
    try:
        # Created here, not by SQLite, so that it never exists with the
        # umask's mode; SQLite gives its -wal and -shm files the same mode.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
    except OSError as e:
        raise OutboxError(f"cannot open outbox {path}: {e.strerror or e}") from None
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    try:
        (app,) = conn.execute("PRAGMA application_id").fetchone()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]
        if app != _APPLICATION_ID and (app != 0 or tables):
            raise OutboxError(f"{path} is not a veil outbox (it is another SQLite database)")
        if app == _APPLICATION_ID and version != _SCHEMA_VERSION:
            raise OutboxError(f"{path} is an outbox of another version ({version})")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(
            f"PRAGMA application_id={_APPLICATION_ID}; PRAGMA user_version={_SCHEMA_VERSION};"
            + _SCHEMA
        )
    except sqlite3.DatabaseError as e:
        conn.close()
        raise OutboxError(f"{path} is not a veil outbox: {e}") from None
    except OutboxError:
        conn.close()
        raise
    return conn

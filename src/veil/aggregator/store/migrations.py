"""One numbered list of schema migrations for both backends, and one
schema-version table (`veil_schema`) recording how many a database holds.

The statements are written in PostgreSQL's dialect; SQLite runs them with its
type names (`sqlite_statements`). An SQLite file from before this list (no
`veil_schema`) is brought up to LEGACY_VERSION by the old column-by-column
upgrade (veil.aggregator.store.sqlite) and recorded as that version, then migrated
like any other.
"""

from __future__ import annotations

import re
import sqlite3
import time as _time
from collections.abc import Callable

# Each entry is one migration; a deployed database records how many it holds.
# Never edit an entry once released: append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE hpke_keys (
        config_id INTEGER PRIMARY KEY, public_key BYTEA NOT NULL, private_key BYTEA NOT NULL,
        created DOUBLE PRECISION NOT NULL);
    CREATE TABLE reports (
        task_id BYTEA NOT NULL, report_id BYTEA NOT NULL, time BIGINT NOT NULL,
        public_share BYTEA NOT NULL, leader_ct BYTEA NOT NULL, helper_ct BYTEA NOT NULL,
        state SMALLINT NOT NULL DEFAULT 0, job_id BYTEA, reason TEXT,
        PRIMARY KEY (task_id, report_id));
    CREATE INDEX reports_state ON reports (task_id, state, time);
    CREATE INDEX reports_job ON reports (task_id, job_id);
    CREATE TABLE aggregation_jobs (
        task_id BYTEA NOT NULL, job_id BYTEA NOT NULL, state TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL, lease_owner TEXT,
        lease_expiry DOUBLE PRECISION NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (task_id, job_id));
    CREATE INDEX aggregation_jobs_open ON aggregation_jobs (created) WHERE state = 'open';
    CREATE TABLE batch_aggregates (
        task_id BYTEA NOT NULL, bucket BIGINT NOT NULL, agg_share BYTEA,
        report_count BIGINT NOT NULL, checksum BYTEA NOT NULL, collected_by BYTEA,
        PRIMARY KEY (task_id, bucket));
    CREATE TABLE rejections (
        task_id BYTEA NOT NULL, reason TEXT NOT NULL, count BIGINT NOT NULL,
        PRIMARY KEY (task_id, reason));
    CREATE TABLE collections (
        task_id BYTEA NOT NULL, job_id BYTEA NOT NULL, start BIGINT NOT NULL,
        duration BIGINT NOT NULL, state TEXT NOT NULL, report_count BIGINT NOT NULL,
        checksum BYTEA NOT NULL, leader_ct BYTEA, helper_ct BYTEA, error_code INTEGER NOT NULL,
        error_message TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, lease_owner TEXT,
        lease_expiry DOUBLE PRECISION NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (task_id, job_id));
    CREATE INDEX collections_pending ON collections (created) WHERE state = 'pending';
    CREATE TABLE helper_jobs (
        task_id BYTEA NOT NULL, job_id BYTEA NOT NULL, request_hash BYTEA NOT NULL,
        response BYTEA NOT NULL, PRIMARY KEY (task_id, job_id));
    CREATE TABLE helper_reports (
        task_id BYTEA NOT NULL, report_id BYTEA NOT NULL, PRIMARY KEY (task_id, report_id));
    """,
    # The privacy budget ledger (veil.dp.budget); amounts are exact fractions as text.
    """
    CREATE TABLE dp_surveys (survey_id TEXT PRIMARY KEY, total TEXT NOT NULL, unit TEXT NOT NULL);
    CREATE TABLE dp_tasks (
        task_id TEXT PRIMARY KEY, total TEXT NOT NULL, unit TEXT NOT NULL,
        survey_id TEXT REFERENCES dp_surveys (survey_id));
    CREATE INDEX dp_tasks_survey ON dp_tasks (survey_id);
    CREATE TABLE dp_spends (
        collection_id TEXT PRIMARY KEY, task_id TEXT NOT NULL REFERENCES dp_tasks (task_id),
        amount TEXT NOT NULL, batch_start BIGINT NOT NULL, batch_end BIGINT NOT NULL);
    CREATE INDEX dp_spends_task ON dp_spends (task_id);
    """,
    # HPKE key rotation states; what garbage collection needs to know about
    # the helper's replay records and job records (veil.aggregator.maintenance).
    """
    ALTER TABLE hpke_keys ADD COLUMN state TEXT NOT NULL DEFAULT 'active';
    ALTER TABLE hpke_keys ADD COLUMN expires_at DOUBLE PRECISION;
    ALTER TABLE helper_reports ADD COLUMN time BIGINT;
    ALTER TABLE helper_reports ADD COLUMN job_id BYTEA;
    ALTER TABLE helper_jobs ADD COLUMN created DOUBLE PRECISION;
    CREATE INDEX helper_reports_time ON helper_reports (task_id, time);
    CREATE INDEX helper_reports_job ON helper_reports (task_id, job_id);
    """,
    # Failed jobs wait before they are leased again (retry_at), and say why.
    """
    ALTER TABLE aggregation_jobs ADD COLUMN retry_at DOUBLE PRECISION NOT NULL DEFAULT 0;
    ALTER TABLE aggregation_jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE aggregation_jobs ADD COLUMN error TEXT;
    ALTER TABLE collections ADD COLUMN retry_at DOUBLE PRECISION NOT NULL DEFAULT 0;
    ALTER TABLE collections ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
    """,
    # Batch aggregates in shard rows (veil.aggregator.store.reports): shard 0 is
    # a bucket's lock row, which says whether it is collected; each job adds
    # to one of the shards 1..AGGREGATE_SHARDS. A new primary key means a new
    # table (SQLite cannot change one in place); the rows there were become
    # shard 0, which the readers merge like any other.
    """
    CREATE TABLE batch_aggregates_sharded (
        task_id BYTEA NOT NULL, bucket BIGINT NOT NULL, shard SMALLINT NOT NULL,
        agg_share BYTEA, report_count BIGINT NOT NULL, checksum BYTEA NOT NULL,
        collected_by BYTEA, PRIMARY KEY (task_id, bucket, shard));
    INSERT INTO batch_aggregates_sharded
        (task_id, bucket, shard, agg_share, report_count, checksum, collected_by)
        SELECT task_id, bucket, 0, agg_share, report_count, checksum, collected_by
        FROM batch_aggregates;
    DROP TABLE batch_aggregates;
    ALTER TABLE batch_aggregates_sharded RENAME TO batch_aggregates;
    """,
    # A report the helper found too early (its clock behind the leader's)
    # waits as pending until retry_at (the database's clock), its reason
    # saying why; the leader's latest reading of each helper's clock offset
    # (veil.aggregator.leader.skew), for veil status and the upload front ends.
    """
    ALTER TABLE reports ADD COLUMN retry_at DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE TABLE peer_clocks (
        peer TEXT PRIMARY KEY, offset_seconds DOUBLE PRECISION NOT NULL,
        uncertainty DOUBLE PRECISION NOT NULL, measured DOUBLE PRECISION NOT NULL);
    """,
    # Poplar1 (issue 27): each aggregation parameter a batch was queried with,
    # one row per (batch, level), with this aggregator's sum for it; the
    # helper's replay records per (batch, level); a collection's parameter.
    """
    CREATE TABLE prefix_queries (
        task_id BYTEA NOT NULL, start BIGINT NOT NULL, duration BIGINT NOT NULL,
        level INTEGER NOT NULL, agg_param BYTEA NOT NULL, agg_share BYTEA,
        report_count BIGINT NOT NULL, checksum BYTEA NOT NULL, collected_by BYTEA,
        PRIMARY KEY (task_id, start, level));
    CREATE TABLE prefix_reports (
        task_id BYTEA NOT NULL, start BIGINT NOT NULL, level INTEGER NOT NULL,
        report_id BYTEA NOT NULL, PRIMARY KEY (task_id, start, level, report_id));
    ALTER TABLE collections ADD COLUMN agg_param BYTEA;
    """,
    # Each report's shares written once (issue 28): the part of a report that
    # never changes (its public share and ciphertexts, 3 KB for a
    # Histogram(100,10)) moves to report_shares, and `reports` keeps what
    # changes (state, job, reason, retry time) with what its indexes need
    # (time), so that putting a report in a job and finishing it rewrites a
    # narrow row instead of the whole report (on SQLite its page went to the
    # WAL again at every change). Two new tables rather than columns dropped
    # in place: SQLite cannot drop a column from a table with its indexes,
    # and PostgreSQL would keep the dropped columns' bytes in every row.
    """
    CREATE TABLE report_shares (
        task_id BYTEA NOT NULL, report_id BYTEA NOT NULL, public_share BYTEA NOT NULL,
        leader_ct BYTEA NOT NULL, helper_ct BYTEA NOT NULL, PRIMARY KEY (task_id, report_id));
    INSERT INTO report_shares (task_id, report_id, public_share, leader_ct, helper_ct)
        SELECT task_id, report_id, public_share, leader_ct, helper_ct FROM reports;
    CREATE TABLE report_states (
        task_id BYTEA NOT NULL, report_id BYTEA NOT NULL, time BIGINT NOT NULL,
        state SMALLINT NOT NULL DEFAULT 0, job_id BYTEA, reason TEXT,
        retry_at DOUBLE PRECISION NOT NULL DEFAULT 0, PRIMARY KEY (task_id, report_id));
    INSERT INTO report_states (task_id, report_id, time, state, job_id, reason, retry_at)
        SELECT task_id, report_id, time, state, job_id, reason, retry_at FROM reports;
    DROP TABLE reports;
    ALTER TABLE report_states RENAME TO reports;
    CREATE INDEX reports_state ON reports (task_id, state, time);
    CREATE INDEX reports_job ON reports (task_id, job_id);
    """,
    # A job's reports are looked up by job id only (a job's reports, and
    # garbage collection's test for a job without reports), never by a
    # missing one: a pending report need not be in reports_job. Partial, the
    # index is written when a report is put in a job rather than on upload
    # too, and holds only the reports that have a job (issue 28: the SQLite
    # leader's store work 34.9 -> 32.9 us a Count report in process).
    """
    DROP INDEX reports_job;
    CREATE INDEX reports_job ON reports (task_id, job_id) WHERE job_id IS NOT NULL;
    """,
    # A report's invitation token (issue 40, item 2), which the leader sends
    # the helper with the report: its challenge commits to the report's
    # content, so the helper's copy can no longer be sealed inside the
    # helper's own share. NULL for reports stored before (and for tasks
    # without invitations, which store an empty one).
    """
    ALTER TABLE report_shares ADD COLUMN token BYTEA;
    """,
    # The leader-selected batch each of the helper's DAP jobs put its reports
    # in (issue 43: the leader_selected_batch_id extension); NULL for a job
    # of time buckets.
    """
    ALTER TABLE helper_jobs ADD COLUMN batch_id BYTEA;
    """,
    # The leader's leader-selected batches (veil.aggregator.store.batches):
    # each batch's id and bucket, and the batch each aggregation job's
    # reports join, chosen when the job is made.
    """
    CREATE TABLE leader_batches (
        task_id BYTEA NOT NULL, batch_id BYTEA NOT NULL, bucket BIGINT NOT NULL,
        created DOUBLE PRECISION NOT NULL, PRIMARY KEY (task_id, batch_id));
    ALTER TABLE aggregation_jobs ADD COLUMN batch_id BYTEA;
    CREATE INDEX aggregation_jobs_batch ON aggregation_jobs (task_id, batch_id)
        WHERE batch_id IS NOT NULL;
    """,
)

SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS veil_schema (version INTEGER NOT NULL,"
    " applied DOUBLE PRECISION NOT NULL)"
)

# What an SQLite file from before the numbered list held: the tables and
# columns of migrations 1 to 4 (checked by the storage tests).
LEGACY_VERSION = 4

_SQLITE_TYPES = (
    ("BYTEA", "BLOB"),
    ("DOUBLE PRECISION", "REAL"),
    ("BIGINT", "INTEGER"),
    ("SMALLINT", "INTEGER"),
    ("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS "),
    ("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS "),
)


def check_version(current: int) -> None:
    if current > len(MIGRATIONS):
        raise RuntimeError(
            f"the database's schema is version {current}, newer than this veil"
            f" ({len(MIGRATIONS)}): upgrade veil"
        )


def sqlite_statements(migration: str) -> list[str]:
    """A migration's statements in SQLite's dialect. IF NOT EXISTS: the budget
    ledger (veil.dp.budget) may have made its tables in the file first."""
    for pg, lite in _SQLITE_TYPES:
        migration = migration.replace(pg, lite)
    return [s.strip() for s in re.split(r";\s*\n", migration) if s.strip()]


def migrate_sqlite(db: sqlite3.Connection, legacy: Callable[[sqlite3.Connection], None]) -> int:
    """Bring an SQLite database (autocommit connection) up to date in one
    transaction; returns the version it now has."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(SCHEMA_TABLE)
        row = db.execute("SELECT max(version) FROM veil_schema").fetchone()
        current = int(row[0]) if row is not None and row[0] is not None else 0
        if (
            current == 0
            and db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reports'"
            ).fetchone()
        ):
            legacy(db)
            # The ledger's tables (migration 2) were made by the ledger when
            # it first opened the file, so a file may lack them.
            for statement in sqlite_statements(MIGRATIONS[1]):
                db.execute(statement)
            current = LEGACY_VERSION
            db.execute("INSERT INTO veil_schema VALUES (?, ?)", (current, _time.time()))
        check_version(current)
        for version in range(current + 1, len(MIGRATIONS) + 1):
            for statement in sqlite_statements(MIGRATIONS[version - 1]):
                db.execute(statement)
            db.execute("INSERT INTO veil_schema VALUES (?, ?)", (version, _time.time()))
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return len(MIGRATIONS)

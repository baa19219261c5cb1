"""What the reliability suites share: time buckets, database probes, figures.

Every suite talks to real leader and helper processes on loopback
(veil.local.launcher) and reads their SQLite files read-only to check what
was stored; nothing here stands in for a component.

Figures: when VEIL_RELIABILITY_OUT names a file, each suite appends one JSON
line per experiment (what was tried, how often, what happened). The table
of docs/reports/RELIABILITY.md is written from these lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import grpc

from tests.support.deployment import Deployment
from tests.support.helper_rpc import honest_items
from tests.support.times import past_bucket
from veil.aggregator.core import VerifyInitItem
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.hpke import ROLE_HELPER

TP = 3600

# Statuses an aggregator documents for a refused call (docs/CLIENT.md, "Errors").
DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}


# One "now" for the whole session: tests that share a deployment each take
# the next bucket back (bucket(2), bucket(3), ...), and if every call read the
# clock, an hour turning between two tests would hand the later one the
# earlier one's bucket, already collected. Buckets a run takes are at most
# its length staler, still in the past (or, negative, the future).
_SESSION_NOW = int(time.time())


def bucket(hours_ago: int, tp: int = TP) -> int:
    return past_bucket(hours_ago, tp, now=_SESSION_NOW)


def record(suite: str, **figures: Any) -> None:
    """Append one experiment's figures to $VEIL_RELIABILITY_OUT (if set)."""
    out = os.environ.get("VEIL_RELIABILITY_OUT")
    if not out:
        return
    line = {"suite": suite, "long": os.environ.get("VEIL_TEST_LONG") == "1", **figures}
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, default=str) + "\n")


def query(db: Path, sql: str, *args: Any) -> list[Any]:
    """Read-only query of a server's database (the server may be writing)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def state_digest(db: Path) -> str:
    """A digest of every row of every table: equal digests mean no state change."""
    h = hashlib.sha256()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        for name in names:
            h.update(name.encode())
            for row in sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{name}"')):
                h.update(row.encode())
    finally:
        conn.close()
    return h.hexdigest()


def rejections(db: Path, task_id: bytes) -> dict[str, int]:
    """The server's rejection counts, through its store (the server may be writing)."""
    store = SqliteDatastore(db)
    try:
        return store.rejections(task_id)
    finally:
        store.close()


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def leader_verify_init_item(dep: Deployment, name: str, t: int, value: int) -> VerifyInitItem:
    """An aggregation job item for `value` at `t` as an honest leader would
    send it to the deployment's helper (tests.support.helper_rpc.honest_items)."""
    (item,) = honest_items(
        dep.tasks[name].leader, [value], dep.client(name).hpke_config(ROLE_HELPER), t
    )
    return item

"""Operating an aggregator's database: HPKE key rotation and garbage collection.

Both run against the `Datastore` alone, so the server's background step and
the `veil keys` / `veil gc` commands (another process, same database) share
them.

Key rotation (the life of a key follows Janus's key rotator):

    pending --(after pending_seconds, or on command)--> active
    active  --(when another key becomes active)-------> expired
    expired --(grace_seconds later, by GC)------------> deleted

Every stored key opens ciphertexts; only the active key is advertised. A
client caches an aggregator's config for `veil.client.CONFIG_LIFETIME`, so
reports sealed to the previous key keep arriving for that long after a
rotation, and reports already stored are opened when aggregated: the grace
period must cover both. Pending keys exist so that, with several replicas
of an aggregator, every replica knows a key before any client is told
about it.

Garbage collection follows each task's `report_expiry_age` (see
`Datastore.collect_garbage` for what is deleted and why replay protection
survives it).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    KEY_ACTIVE,
    KEY_PENDING,
    GcResult,
    HpkeKey,
    StorageConflict,
)
from veil.hpke import generate_keypair
from veil.task import Task

log = logging.getLogger(__name__)

# Defaults of the [keys] table of a server configuration.
DEFAULT_PENDING_SECONDS = 60.0
DEFAULT_GRACE_SECONDS = 24 * 3600.0


class KeyRotationError(Exception):
    """A key operation cannot be done; the message says why."""


@dataclass(frozen=True)
class KeyPolicy:
    pending_seconds: float = DEFAULT_PENDING_SECONDS
    grace_seconds: float = DEFAULT_GRACE_SECONDS


def active_key(keys: Iterable[HpkeKey]) -> HpkeKey | None:
    """The key to advertise: the newest active key (older files may hold several)."""
    active = [k for k in keys if k.state == KEY_ACTIVE]
    return max(active, key=lambda k: k.created) if active else None


def ensure_active_key(store: Datastore, now: float) -> None:
    """Give a new database its first key, active at once (nothing to roll over).

    Processes starting together on a new database (an upload front end and
    workers) each offer a key; the store keeps one. Each creating its own
    made several active keys, and reports sealed to one process's key were
    rejected by another as hpke_unknown_config_id."""
    if store.hpke_keys():
        return
    key = HpkeKey(generate_keypair(secrets.randbelow(256)), KEY_ACTIVE, now)
    if store.add_first_hpke_key(key):
        log.info("added HPKE key", extra={"config_id": key.config_id, "state": KEY_ACTIVE})


def add_key(store: Datastore, now: float, state: str = KEY_PENDING) -> HpkeKey:
    """A fresh keypair under a config id no stored key uses."""
    for _ in range(64):
        taken = {k.config_id for k in store.hpke_keys()}
        free = [i for i in range(256) if i not in taken]
        if not free:
            raise KeyRotationError(
                "all 256 HPKE config ids are in use: run `veil gc` to delete expired keys"
            )
        key = HpkeKey(generate_keypair(free[secrets.randbelow(len(free))]), state, now)
        try:
            store.add_hpke_key(key)
        except StorageConflict:
            continue  # another process took the id meanwhile
        log.info("added HPKE key", extra={"config_id": key.config_id, "state": state})
        return key
    raise KeyRotationError("could not allocate an HPKE config id")


def activate(store: Datastore, config_id: int, now: float, grace_seconds: float) -> None:
    try:
        store.activate_hpke_key(config_id, now, grace_seconds)
    except StorageConflict as e:
        raise KeyRotationError(str(e)) from None
    log.info("activated HPKE key", extra={"config_id": config_id})


def rotate(store: Datastore, now: float, policy: KeyPolicy, immediately: bool) -> HpkeKey:
    """Add a pending key; with `immediately`, make it the active key now."""
    key = add_key(store, now, KEY_PENDING)
    if immediately:
        activate(store, key.config_id, now, policy.grace_seconds)
    return key


def advance_keys(store: Datastore, now: float, policy: KeyPolicy) -> list[str]:
    """Promote the newest pending key that has waited long enough, and delete
    expired keys whose grace has ended. Returns what happened, for the log."""
    events = []
    keys = store.hpke_keys()
    ripe = [k for k in keys if k.state == KEY_PENDING and k.created + policy.pending_seconds <= now]
    if ripe:
        newest = max(ripe, key=lambda k: k.created)
        activate(store, newest.config_id, now, policy.grace_seconds)
        events.append(f"activated key {newest.config_id}")
    for config_id in store.delete_expired_hpke_keys(now):
        log.info("deleted expired HPKE key", extra={"config_id": config_id})
        events.append(f"deleted expired key {config_id}")
    return events


def gc_task(store: Datastore, task: Task, now: float) -> GcResult:
    """Delete what no rule needs any more for one task.

    The horizon is pushed back by the task's clock skew: a wall clock that
    steps back a little must not make the server accept again a report GC
    has already forgotten. Helper job records go once every report they can
    hold (at most max_clock_skew after the job was recorded) is past it.
    """
    horizon = task.report_horizon(now)
    if horizon is not None:
        horizon -= task.max_clock_skew
    job_horizon = None if horizon is None else float(horizon - task.max_clock_skew)
    # A Poplar1 task's state is freed by its own rules (store.upkeep).
    last_level = task.vdaf.bits - 1 if task.vdaf.is_prefix else None
    return store.collect_garbage(
        task.task_id, task.time_precision, horizon, job_horizon, last_level
    )


def collect_garbage(
    store: Datastore, tasks: Iterable[Task], now: float, full_vacuum: bool = False
) -> dict[str, GcResult]:
    """GC every task, then give the freed space back to the file system."""
    results = {}
    for task in tasks:
        result = gc_task(store, task, now)
        results[task.id_text] = result
        if result.total():
            log.info(
                "garbage collected %d rows",
                result.total(),
                extra={
                    "task_id": task.id_text,
                    "reports": result.reports,
                    "aggregation_jobs": result.aggregation_jobs,
                    "batch_aggregates": result.batch_aggregates,
                    "replay_records": result.replay_records,
                    "helper_jobs": result.helper_jobs,
                    "collections": result.collections,
                    "prefix_reports": result.prefix_reports,
                    "prefix_queries": result.prefix_queries,
                    "leader_batches": result.leader_batches,
                },
            )
    store.reclaim_space(full=full_vacuum)
    return results

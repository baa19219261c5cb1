"""What `veil status` shows: an aggregator's state, read from its own database.

An operator-side tool: it reads the database the server writes (SQLite in
WAL mode lets it do so while the server runs) and the server's
configuration, never the network. Nothing secret is shown: keys appear by
config id and state, tasks by id.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

from veil.aggregator.maintenance import active_key
from veil.aggregator.run.config import ServerConfig
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.postgres import storage_label
from veil.aggregator.store.records import LEADER_SELECTED_BUCKETS, CollectionRecord
from veil.dp import BudgetLedger, BudgetStatus, BudgetUnit, DPError
from veil.dp.accounting import Guarantee
from veil.survey.statement import task_statement
from veil.task import Task

# Text output lists at most this many of the newest batches per task.
TEXT_BATCHES = 12


def _utc(t: float | None) -> str | None:
    if t is None or t >= LEADER_SELECTED_BUCKETS:
        return None  # a leader-selected batch has no time (see _where)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _where(start: int) -> str:
    """A batch's start as people read it: its time, or a leader-selected
    batch's id (the first 7 bytes its bucket holds)."""
    if start >= LEADER_SELECTED_BUCKETS:
        return f"batch {start - LEADER_SELECTED_BUCKETS:014x}.."
    return str(_utc(start))


def _span(start: int, duration: int) -> str:
    if start >= LEADER_SELECTED_BUCKETS:
        return _where(start)
    return f"[{_utc(start)}, +{duration} s)"


def _budget(status: BudgetStatus, delta: Fraction) -> dict[str, Any]:
    """The ledger's numbers; a ρ budget also says which ε its total and spent imply
    at the task's δ (`implies`: {"total": {...}, "spent": {...}})."""
    out: dict[str, Any] = {
        "unit": status.unit.value,
        "total": str(status.total),
        "spent": str(status.spent),
        "remaining": str(status.remaining),
        "collections": status.collections,
    }
    if status.unit is BudgetUnit.RHO:
        out["implies"] = {
            "total": Guarantee.zcdp(status.total, delta).to_json(),
            "spent": Guarantee.zcdp(status.spent, delta).to_json() if status.spent else None,
        }
    return out


def _task_name(task: Task, files: dict[bytes, Path]) -> str:
    path = files.get(task.task_id)
    return path.name.split(".")[0] if path is not None else task.id_text[:12]


# A Poplar1 task's stored reports: not pending (no aggregation job takes
# them), held until its collections query them level by level.
HELD = "held_for_prefix_queries"


def _prefix_queries(
    task: Task, store: Datastore, collections: list[CollectionRecord]
) -> list[dict[str, Any]]:
    """A Poplar1 task's queries, by batch and level, with the state of each:
    `released` (its collection finished; the helper: it released the level),
    `failed`, `collecting` (the leader's collection is under way) or, at the
    helper, `aggregating` (jobs taken, not yet released)."""
    states = {c.job_id: c.state for c in collections}
    poplar1 = task.vdaf.instantiate_poplar1()
    out = []
    for q in store.prefix_queries(task.task_id, 0, 2**63 - 1):
        if q.collected_by is None:
            state = "aggregating"
        else:
            state = {"finished": "released", "failed": "failed"}.get(
                states.get(q.collected_by, ""), "collecting"
            )
        out.append(
            {
                "start": q.start,
                "start_utc": _utc(q.start),
                "duration": q.duration,
                "level": q.level,
                "candidates": len(poplar1.decode_agg_param(q.agg_param).prefixes),
                "state": state,
                # The leader stores a level's count before the release (to
                # resume it after a crash) but shows it once released, as
                # before it stored it then.
                "report_count": q.report_count if state in ("released", "aggregating") else 0,
            }
        )
    return out


def _prefix_batch_state(task: Task, levels: list[dict[str, Any]]) -> str:
    """A Poplar1 bucket: `held` (not queried yet), `queried` (a level may
    follow), or `done` (its last level released, or a level failed: no
    level of it can be queried again)."""
    if not levels:
        return "held"
    last = task.vdaf.bits - 1
    if any(q["state"] == "failed" for q in levels) or any(
        q["level"] == last and q["state"] == "released" for q in levels
    ):
        return "done"
    return "queried"


def gather(
    role: str, config: ServerConfig, store: Datastore, ledger: BudgetLedger
) -> dict[str, Any]:
    """The status as JSON-ready values."""
    files = {t.task_id: p for t, p in zip(config.tasks, config.task_paths, strict=False)}
    keys = store.hpke_keys()
    advertised = active_key(keys)
    open_jobs = Counter(task_id for task_id, _ in store.open_aggregation_jobs())
    tasks = []
    surveys: dict[str, dict[str, Any]] = {}
    for task in config.tasks:
        counts = store.report_counts(task.task_id, task.time_precision)
        # A bucket's shard rows add up; its lock row says who closed it.
        aggregated: Counter[int] = Counter()
        closed: dict[int, bytes | None] = {}
        for a in store.batch_aggregates(task.task_id, 0, 2**63 - 1):
            aggregated[a.bucket] += a.report_count
            closed[a.bucket] = closed.get(a.bucket) or a.collected_by
        collections = store.collections(task.task_id)
        # A job its collector deleted keeps its batch closed for good.
        finished_by = {c.job_id for c in collections if c.state in ("finished", "deleted")}
        queries = _prefix_queries(task, store, collections) if task.vdaf.is_prefix else None
        batches = []
        # A leader-selected task's reports are counted by time (its
        # `reports`), its batches are the leader's: only those are listed.
        by_time = {} if task.dap is not None and task.dap.leader_selected else counts
        for bucket in sorted(set(by_time) | set(closed)):
            by_state = by_time.get(bucket, {})
            closed_by = closed.get(bucket)
            if closed_by is None:
                state = "open"
            else:
                state = "collected" if closed_by in finished_by else "collecting"
            waiting = by_state.get("pending", 0) + by_state.get("in_job", 0)
            batch: dict[str, Any] = {
                "start": bucket,
                "start_utc": _utc(bucket),
                "aggregated": aggregated[bucket],
                "pending": waiting,
                "rejected": by_state.get("rejected", 0),
                "state": state,
            }
            if queries is not None:
                # A text question's reports wait for its collections, which
                # aggregate them level by level: held, not pending.
                levels = [q for q in queries if q["start"] <= bucket < q["start"] + q["duration"]]
                batch.update(
                    pending=0,
                    held=waiting,
                    levels=[q["level"] for q in levels],
                    state=_prefix_batch_state(task, levels),
                )
            if bucket >= LEADER_SELECTED_BUCKETS:
                # DAP's leader-selected batch: its id's first 7 bytes, in hex.
                batch["batch_id"] = f"{bucket - LEADER_SELECTED_BUCKETS:014x}"
            batches.append(batch)
        totals: Counter[str] = Counter()
        for by_state in counts.values():
            totals.update(by_state)
        if queries is not None and "pending" in totals:
            totals[HELD] = totals.pop("pending")
        budget = None
        if task.dp.has_noise:
            try:
                budget = _budget(ledger.task_status(task.id_text), task.dp.delta_value)
            except DPError:
                budget = None  # the server has not registered it yet
            if task.dp.survey is not None and task.dp.survey not in surveys:
                with contextlib.suppress(DPError):  # not registered by the server yet
                    surveys[task.dp.survey] = _budget(
                        ledger.survey_status(task.dp.survey), task.dp.delta_value
                    )
        tasks.append(
            {
                "task_id": task.id_text,
                "name": _task_name(task, files),
                "vdaf": task.vdaf.to_dict(),
                "dp": task.dp.to_dict(),
                "exact_release": not task.dp.has_noise,
                "time_precision": task.time_precision,
                "min_batch_size": task.min_batch_size,
                "report_expiry_age": task.report_expiry_age,
                "reports": dict(sorted(totals.items())),
                "rejections": dict(sorted(store.rejections(task.task_id).items())),
                # Pending reports the helper found too early: sent again later.
                "waiting_for_helper_clock": store.deferred_count(task.task_id),
                "pending_aggregation_jobs": open_jobs.get(task.task_id, 0),
                # Jobs that failed at least once: retrying (open) or given up.
                "failed_aggregation_jobs": [
                    {"job_id": j.hex(), "state": st, "failures": n, "error": e}
                    for j, (st, n, e) in sorted(store.aggregation_job_errors(task.task_id).items())
                ],
                "batches": batches,
                "collections": [
                    {
                        "job_id": c.job_id.hex(),
                        "start": c.start,
                        "duration": c.duration,
                        # A pending job with an error is being retried.
                        "state": "retrying"
                        if c.state == "pending" and c.error_message
                        else c.state,
                        "report_count": c.report_count,
                        "error": c.error_message or None,
                    }
                    for c in collections
                ],
                "budget": budget,
                "privacy": task_statement(task.dp, task.vdaf, task.noise_added_by).to_json(),
                **({"prefix_queries": queries} if queries is not None else {}),
            }
        )
    return {
        "role": role,
        "listen": config.listen,
        "allow_exact_release": config.allow_exact_release,
        "database": {"path": storage_label(config.storage), "bytes": store.size_bytes()},
        "hpke_keys": [
            {
                "config_id": k.config_id,
                "state": k.state,
                "advertised": advertised is not None and k.config_id == advertised.config_id,
                "created": _utc(k.created),
                "expires": _utc(k.expires_at),
            }
            for k in keys
        ],
        # The leader's latest reading of each helper's clock (veil.aggregator.leader.skew).
        "helper_clocks": [
            {
                "helper": peer,
                "offset_seconds": round(offset, 3),
                "uncertainty_seconds": round(uncertainty, 3),
                "measured": _utc(measured),
            }
            for peer, offset, uncertainty, measured in store.peer_clocks()
        ],
        "tasks": tasks,
        "surveys": surveys,
    }


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _budget_text(b: dict[str, Any]) -> str:
    unit = "ε" if b["unit"] == "epsilon" else "ρ"
    text = (
        f"spent {b['spent']} of {b['total']} {unit}, {b['remaining']} remaining"
        f" ({b['collections']} collections)"
    )
    implied = b.get("implies", {}).get("total")
    if implied is not None:
        text += f"; ρ {b['total']} implies (ε = {implied['epsilon']}, δ = {implied['delta']})"
    return text


def _guarantee_text(g: dict[str, str] | None) -> str:
    if g is None:
        return "none (exact release)"
    if "rho" in g:
        return f"ρ = {g['rho']} (ε = {g['epsilon']}, δ = {g['delta']})"
    return f"ε = {g['epsilon']}"


def _privacy_text(p: dict[str, Any]) -> list[str]:
    """Both guarantees of a task over its whole budget (its privacy statement)."""
    lines = [
        f"privacy ({p['unit']}, {p['neighbouring']}): against the collector"
        f" {_guarantee_text(p['against_collector'])}; against the collector with one"
        f" aggregator {_guarantee_text(p['against_collector_and_one_aggregator'])}"
    ]
    if "against_everyone" in p:
        lines.append(f"  against everyone: {_guarantee_text(p['against_everyone'])}")
    return lines


def render_text(status: dict[str, Any]) -> str:
    out = [
        f"{status['role']} on {status['listen']}; database {status['database']['path']}"
        f" ({_size(status['database']['bytes'])})",
        "",
        "exact release (mechanism none): "
        + ("allowed by this config" if status["allow_exact_release"] else "refused"),
        "",
        "HPKE keys:",
    ]
    for k in status["hpke_keys"]:
        mark = "  (advertised)" if k["advertised"] else ""
        expires = f", deleted after {k['expires']}" if k["expires"] else ""
        out.append(f"  {k['config_id']:>3}  {k['state']:<8} created {k['created']}{expires}{mark}")
    if status["helper_clocks"]:
        out += ["", "helper clocks (the helper's minus this leader's, from its last answer):"]
    for c in status["helper_clocks"]:
        side = "ahead" if c["offset_seconds"] >= 0 else "behind"
        out.append(
            f"  {c['helper']}  {abs(c['offset_seconds']):.1f} s {side}"
            f" (± {c['uncertainty_seconds']:.3f} s), measured {c['measured']}"
        )
    for t in status["tasks"]:
        vdaf = ", ".join(f"{k}={v}" for k, v in t["vdaf"].items())
        dp = ", ".join(f"{k}={v}" for k, v in t["dp"].items())
        expiry = t["report_expiry_age"]
        out += [
            "",
            f"task {t['name']} ({t['task_id']})",
            f"  vdaf {vdaf}; dp {dp}"
            + ("  (EXACT RELEASE: no noise added)" if t["exact_release"] else ""),
            f"  time_precision {t['time_precision']} s, min_batch_size {t['min_batch_size']},"
            f" report_expiry_age {f'{expiry} s' if expiry else 'none'}",
        ]
        if t["reports"]:
            out.append(
                "  reports stored: " + ", ".join(f"{k} {v}" for k, v in t["reports"].items())
            )
        if t["rejections"]:
            out.append(
                "  rejected by reason: " + ", ".join(f"{k} {v}" for k, v in t["rejections"].items())
            )
        if t["waiting_for_helper_clock"]:
            out.append(
                f"  reports waiting for the helper's clock: {t['waiting_for_helper_clock']}"
                " (it found them too early; they are sent again)"
            )
        if "prefix_queries" in t:
            out.append(
                "  text question (Poplar1): reports are held for its collections' prefix"
                " queries, level by level, not aggregation jobs"
            )
        else:
            out.append(f"  pending aggregation jobs: {t['pending_aggregation_jobs']}")
        for j in t["failed_aggregation_jobs"]:
            what = (
                f"retrying after {j['failures']} failures" if j["state"] == "open" else "given up"
            )
            out.append(f"    {j['job_id'][:16]}  {what}: {j['error']}")
        out.extend(f"  {line}" for line in _privacy_text(t["privacy"]))
        if t["budget"] is not None:
            out.append(f"  budget: {_budget_text(t['budget'])}")
        batches = t["batches"]
        out.append(f"  batches: {len(batches)}")
        if batches and "prefix_queries" in t:
            out.append("    start (UTC)                  held  rejected  state")
            hidden = len(batches) - TEXT_BATCHES
            if hidden > 0:
                out.append(f"    ... {hidden} older")
            for b in batches[-TEXT_BATCHES:]:
                levels = ", ".join(str(v) for v in b["levels"])
                queried = f" (levels {levels})" if levels else ""
                out.append(
                    f"    {b['start_utc']:<22} {b['held']:>10} {b['rejected']:>9}"
                    f"  {b['state']}{queried}"
                )
        elif batches:
            out.append("    start (UTC)            aggregated  pending  rejected  state")
            hidden = len(batches) - TEXT_BATCHES
            if hidden > 0:
                out.append(f"    ... {hidden} older")
            for b in batches[-TEXT_BATCHES:]:
                out.append(
                    f"    {_where(b['start']):<22} {b['aggregated']:>10} {b['pending']:>8}"
                    f" {b['rejected']:>9}  {b['state']}"
                )
        queries = t.get("prefix_queries", [])
        if queries:
            out.append("  prefix queries (batch, level, candidates):")
        for q in queries[-TEXT_BATCHES:]:
            out.append(
                f"    [{q['start_utc']}, +{q['duration']} s)  level {q['level']}:"
                f" {q['candidates']} candidates, {q['state']}, {q['report_count']} reports"
            )
        out.append(f"  collections: {len(t['collections'])}")
        for c in t["collections"]:
            error = f": {c['error']}" if c["error"] else ""
            out.append(
                f"    {c['job_id'][:16]}  {_span(c['start'], c['duration'])}"
                f"  {c['state']}, {c['report_count']} reports{error}"
            )
    for name, b in status["surveys"].items():
        out += ["", f"survey {name}: {_budget_text(b)}"]
    return "\n".join(out)

"""Operating real servers: key rotation under load, status, GC, metrics, logs.

One deployment (a leader and a helper process on loopback) serves every test
here; the `veil keys`, `veil status` and `veil gc` commands run as separate
processes against the servers' databases while the servers run.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.cli import run_veil
from tests.support.deployment import Deployment, start_deployment
from tests.support.times import past_bucket
from veil.client import Client, UploadError
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.observations import json_paths, load_inventory, unclassified
from veil.task import DpSpec, VdafSpec

TP = 3600
NONE = DpSpec("none")


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    survey = DpSpec("geometric", epsilon="1", budget="2", survey="ops", survey_budget="3")
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "stream": (VdafSpec("sum", max_measurement=100), NONE, {"min_batch_size": 1}),
        "dp": (VdafSpec("count"), survey, {"min_batch_size": 1}),
        "expiring": (
            VdafSpec("sum", max_measurement=10),
            NONE,
            {"time_precision": 1, "report_expiry_age": 5, "max_clock_skew": 1, "min_batch_size": 1},
        ),
    }
    extra = {
        "gc": {"interval": 0.5},
        # Keys change only on command here; the grace outlasts the module.
        "keys": {"pending_seconds": 3600, "grace_seconds": 3600},
        "log_format": "json",
    }
    d = start_deployment(
        Path(tmp_path_factory.mktemp("ops")), tasks, job_size=20, metrics=True, extra_config=extra
    )
    try:
        yield d
    finally:
        d.stop()


def veil(*args: str) -> str:
    done = run_veil(*args, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def scrape(address: str | None) -> str:
    assert address is not None
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start} in:\n{text}")


class Uploader(threading.Thread):
    """Uploads batches of random values until stopped; keeps what was acknowledged.

    `fresh` makes a new client (and so fetches the configs anew) per batch;
    otherwise one client keeps its cached configs throughout.
    """

    def __init__(self, dep: Deployment, report_time: int, fresh: bool) -> None:
        super().__init__(daemon=True)
        self.dep, self.report_time, self.fresh = dep, report_time, fresh
        self.acknowledged: list[int] = []
        self.config_ids: list[tuple[int, int]] = []
        self.batches = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        task = self.dep.tasks["stream"].client
        client = Client(task)
        try:
            while not self.stop.is_set():
                if self.fresh:
                    client.close()
                    client = Client(task)
                values = [secrets.randbelow(101) for _ in range(5)]
                result = client.upload_batch(values, report_time=self.report_time)
                assert (result.accepted, result.duplicates) == (5, 0)
                self.acknowledged += values
                self.config_ids.append(
                    (
                        client.hpke_config(ROLE_LEADER).config_id,
                        client.hpke_config(ROLE_HELPER).config_id,
                    )
                )
                self.batches += 1
        except BaseException as e:
            self.error = e
        finally:
            client.close()

    def wait_batches(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.batches < n and self.error is None:
            assert time.monotonic() < deadline, "uploads stalled"
            time.sleep(0.05)
        assert self.error is None, self.error


def advertised(dep: Deployment) -> tuple[int, int]:
    with Client(dep.tasks["stream"].client) as probe:
        return probe.hpke_config(ROLE_LEADER).config_id, probe.hpke_config(ROLE_HELPER).config_id


def test_rotation_mid_stream_loses_nothing(dep: Deployment) -> None:
    t = past_bucket(1)
    before = advertised(dep)
    cached = Uploader(dep, t, fresh=False)
    fresh = Uploader(dep, t, fresh=True)
    cached.start()
    fresh.start()
    try:
        cached.wait_batches(3)
        fresh.wait_batches(3)
        for role in ("leader", "helper"):
            out = veil("keys", "rotate", "--now", "--config", str(dep.local.root / f"{role}.toml"))
            assert "is active" in out
        # The servers notice the new keys on their own (no restart).
        deadline = time.monotonic() + 30
        after = advertised(dep)
        while after[0] == before[0] or after[1] == before[1]:
            assert time.monotonic() < deadline, "the servers still advertise the old keys"
            time.sleep(0.2)
            after = advertised(dep)
        seen = fresh.batches
        fresh.wait_batches(seen + 3)
        cached.wait_batches(cached.batches + 3)
    finally:
        cached.stop.set()
        fresh.stop.set()
        cached.join(60)
        fresh.join(60)
    assert cached.error is None and fresh.error is None, (cached.error, fresh.error)
    # The long-lived client sealed to the retired keys throughout; the fresh
    # clients moved to the new ones.
    assert set(cached.config_ids) == {before}
    assert fresh.config_ids[0] == before and fresh.config_ids[-1] == after

    acknowledged = cached.acknowledged + fresh.acknowledged
    with dep.collector("stream") as collector:
        r = collector.collect(t, TP, wait=120)
    assert r.report_count == len(acknowledged)
    assert r.estimate == sum(acknowledged)
    assert dep.rejections("leader", "stream") == {}
    assert dep.rejections("helper", "stream") == {}

    keys = json.loads(
        veil("keys", "list", "--json", "--config", str(dep.local.root / "leader.toml"))
    )
    states = {k["config_id"]: k["state"] for k in keys}
    assert states == {before[0]: "expired", after[0]: "active"}


def test_status_gc_and_metrics(dep: Deployment) -> None:
    t = past_bucket(2)
    with dep.client("dp") as client:
        client.upload_batch([1] * 20 + [0] * 10, report_time=t)
    with dep.collector("dp") as collector:
        r = collector.collect(t, TP, wait=120)
    assert r.report_count == 30 and r.epsilon_spent == 1

    leader_config = str(dep.local.root / "leader.toml")
    status = json.loads(veil("status", "--json", "--config", leader_config))
    assert status["role"] == "leader"
    # Every key is in the observation inventory (docs/OBSERVATIONS.md).
    observed = json_paths(status, "json:veil-status")
    assert unclassified(load_inventory(), "leader_operator", observed) == []
    assert sum(k["advertised"] for k in status["hpke_keys"]) == 1
    task = next(x for x in status["tasks"] if x["name"] == "dp")
    assert task["task_id"] == dep.tasks["dp"].client.id_text
    batch = next(b for b in task["batches"] if b["start"] == t)
    assert (batch["aggregated"], batch["pending"], batch["state"]) == (30, 0, "collected")
    assert task["pending_aggregation_jobs"] == 0
    assert [(c["state"], c["report_count"]) for c in task["collections"]] == [("finished", 30)]
    assert task["budget"] == {
        "unit": "epsilon",
        "total": "2",
        "spent": "1",
        "remaining": "1",
        "collections": 1,
    }
    assert status["surveys"]["ops"]["spent"] == "1" and status["surveys"]["ops"]["total"] == "3"
    # Both guarantees of the task over its whole budget (issue 14).
    assert task["privacy"]["against_collector"] == {"epsilon": "2", "delta": "0"}
    assert task["privacy"]["against_collector_and_one_aggregator"] == {
        "epsilon": "2",
        "delta": "0",
    }
    helper_status = veil("status", "--config", str(dep.local.root / "helper.toml"))
    assert "helper on" in helper_status and "task dp" in helper_status
    assert "spent 1 of 2 ε" in helper_status and "collected" in helper_status
    assert (
        "against the collector ε = 2; against the collector with one aggregator ε = 2"
        in helper_status
    )

    # The background GC deletes the collected batch's reports; `veil gc`
    # runs the same step by hand and rewrites the file.
    deadline = time.monotonic() + 30
    while dep.stored_reports("dp"):
        assert time.monotonic() < deadline, "background GC did not delete collected reports"
        time.sleep(0.2)
    gc = json.loads(veil("gc", "--vacuum", "--json", "--config", leader_config))
    assert gc["bytes_after"] <= gc["bytes_before"]
    assert set(gc["deleted"]) == {dep.tasks[n].client.id_text for n in ("stream", "dp", "expiring")}

    label = dep.tasks["dp"].client.id_text
    text = scrape(dep.leader.metrics_address)
    assert metric(text, f'veil_reports_received_total{{task="{label}"}}') == 30
    assert metric(text, f'veil_reports_accepted_total{{task="{label}"}}') == 30
    assert metric(text, f'veil_collections_total{{outcome="finished",task="{label}"}}') == 1
    assert metric(text, f'veil_budget_spent{{task="{label}",unit="epsilon"}}') == 1
    assert metric(text, f'veil_budget_remaining{{task="{label}",unit="epsilon"}}') == 1
    assert metric(text, 'veil_budget_spent{task="survey:ops",unit="epsilon"}') == 1
    assert metric(text, 'veil_hpke_opens_total{outcome="ok"}') >= 30
    assert metric(text, 'veil_hpke_keys{state="active"}') == 1
    assert metric(text, "veil_aggregation_job_seconds_count") >= 2
    assert metric(text, "veil_verify_seconds_per_report_count") >= 2
    assert metric(text, "veil_gc_runs_total") >= 1
    assert metric(text, 'veil_gc_deleted_rows_total{kind="reports"}') >= 30
    assert metric(text, "veil_storage_bytes") > 0
    assert metric(text, f'veil_reports_unaggregated{{task="{label}"}}') == 0
    assert metric(text, "veil_aggregation_jobs_open") == 0
    helper_text = scrape(dep.helper.metrics_address)
    assert metric(helper_text, 'veil_hpke_opens_total{outcome="ok"}') >= 30
    assert metric(helper_text, "veil_aggregation_job_seconds_count") >= 2
    assert metric(helper_text, f'veil_budget_spent{{task="{label}",unit="epsilon"}}') == 1


def test_expired_reports_refused_and_collected_in_background(dep: Deployment) -> None:
    with dep.client("expiring") as client:
        reports = [client.build_report(v) for v in (1, 2, 3)]
        assert client.upload_reports(reports).accepted == 3
        deadline = time.monotonic() + 30
        while dep.stored_reports("expiring"):
            assert time.monotonic() < deadline, (
                "expired reports were not deleted; the leader's log ends:\n"
                + (dep.local.root / "leader.log").read_text()[-3000:]
            )
            time.sleep(0.2)
        # Gone from the database, and a replay is refused as too old.
        with pytest.raises(UploadError) as refused:
            client.upload_reports(reports[:1])
        assert refused.value.code == grpc.StatusCode.OUT_OF_RANGE
        assert "expired" in refused.value.message
    label = dep.tasks["expiring"].client.id_text
    text = scrape(dep.leader.metrics_address)
    refusals = f'veil_uploads_refused_total{{reason="report_time_rejected",task="{label}"}}'
    assert metric(text, refusals) == 1
    assert metric(text, f'veil_reports_received_total{{task="{label}"}}') == 3


def test_json_logs_carry_ids_and_no_secrets(dep: Deployment) -> None:
    leader_task = dep.tasks["stream"].leader
    secrets_ = [
        leader_task.aggregator_token,
        dep.tasks["stream"].collector.collector_token,
        # base64url as in the task files
        json.dumps(leader_task.to_dict()["verify_key"]).strip('"'),
    ]
    for role in ("leader", "helper"):
        lines = (dep.local.root / f"{role}.log").read_text().splitlines()
        entries = [json.loads(line) for line in lines if line.startswith("{")]
        assert entries, f"no JSON log lines from the {role}"
        jobs = [e for e in entries if "aggregation job" in e["message"]]
        assert jobs and all({"task_id", "job_id"} <= set(e) for e in jobs)
        text = "\n".join(lines)
        for s in secrets_:
            assert s is not None and s not in text

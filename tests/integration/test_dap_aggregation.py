"""A DAP deployment of veil: a `veil leader` and a `veil helper` process,
each serving DAP over HTTP on loopback beside gRPC (SQLite), veil's DAP
client (veil.client.DapClient) uploading to the leader, the leader's driver
aggregating each task's reports with the helper over DAP (aggregation jobs
and the aggregate share), and veil's DAP collector
(veil.collector.DapCollector) creating a collection job, polling it,
opening both aggregate shares with DAP's associated data and unsharding
Count, Sum, Histogram and SumVec results exactly (no DP in those tasks). Two Count tasks
are leader-selected (DAP's second batch mode): the leader forms batches of
min_batch_size reports and the collector asks for the next one, without DP
and with it. One pair of servers on SQLite serves every case; the Histogram
and the leader-selected batches run on PostgreSQL too."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.postgres import as_url, with_schema
from tests.support.dap_servers import dap_servers
from veil.cli import main
from veil.client import DapClient, client_for
from veil.collector import CollectionError, DapCollector, collector_for
from veil.dap.versions import DapVersion
from veil.local.launcher import free_port
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task, write_toml
from veil.times import format_time

TP = 3600
VERSION = DapVersion.DAP_19


@dataclass
class Deployment:
    leader_url: str
    tasks: dict[str, TaskFiles]
    # Where each server's config (leader.toml, helper.toml) is.
    root: Path


@pytest.fixture(scope="module")
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """A leader and a helper over DAP, each on SQLite or each in a
    PostgreSQL schema of its own (`request.param`)."""
    tmp = tmp_path_factory.mktemp("dap")
    dsn = request.getfixturevalue("postgres_server") if request.param == "postgres" else None
    leader_dap, helper_dap = (f"127.0.0.1:{free_port()}" for _ in range(2))
    leader_grpc, helper_grpc = (f"127.0.0.1:{free_port()}" for _ in range(2))
    spec = DapSpec(f"http://{leader_dap}/", f"http://{helper_dap}/", VERSION.value, "veil")
    chosen = replace(spec, batch_mode="leader-selected")
    tasks = {
        "count": new_task(
            VdafSpec("count"),
            leader_grpc,
            helper_grpc,
            min_batch_size=2,
            dp=DpSpec("none"),
            dap=spec,
        ),
        "histogram": new_task(
            VdafSpec("histogram", length=4, chunk_length=2),
            leader_grpc,
            helper_grpc,
            min_batch_size=2,
            dp=DpSpec("none"),
            dap=spec,
        ),
        "sum": new_task(
            VdafSpec("sum", max_measurement=100),
            leader_grpc,
            helper_grpc,
            min_batch_size=2,
            dp=DpSpec("none"),
            dap=spec,
        ),
        "sumvec": new_task(
            VdafSpec("sumvec", length=3, max_measurement=7, chunk_length=2),
            leader_grpc,
            helper_grpc,
            min_batch_size=2,
            dp=DpSpec("none"),
            dap=spec,
        ),
        "chosen": new_task(
            VdafSpec("count"),
            leader_grpc,
            helper_grpc,
            min_batch_size=3,
            dp=DpSpec("none"),
            dap=chosen,
        ),
        # A budget of one collection: batches of disjoint reports compose in
        # parallel, so each is released.
        "chosen_dp": new_task(
            VdafSpec("count"),
            leader_grpc,
            helper_grpc,
            min_batch_size=3,
            dp=DpSpec("geometric", epsilon="1", budget="1"),
            dap=chosen,
        ),
    }

    def storage(role: str) -> str:
        if dsn is None:
            return f"{role}.db"
        return as_url(with_schema(dsn, f"{role}_{secrets.token_hex(4)}"))

    with dap_servers(tmp, tasks, (leader_grpc, leader_dap), (helper_grpc, helper_dap), storage):
        yield Deployment(f"http://{leader_dap}", tasks, tmp)


def _collect(d: Deployment, name: str, measurements: list[Any]) -> list[int] | int:
    files = d.tasks[name]
    task = files.client
    when = int(time.time()) // TP - 1  # the previous hour, closed
    with client_for(task) as client:
        assert isinstance(client, DapClient)
        uploaded = client.upload_batch(measurements, report_time=when * TP)
    assert uploaded.accepted == len(measurements)

    # The collector's token is asked for: a wrong one is refused, nothing collected.
    wrong = replace(files.collector, collector_token="not-the-token")
    with pytest.raises(CollectionError) as refused:
        DapCollector(wrong).collect(when * TP, TP)
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    with collector_for(files.collector) as collector:
        assert isinstance(collector, DapCollector)
        result = collector.collect(when * TP, TP, wait=120)
    assert result.report_count == len(measurements)
    assert (result.start, result.duration) == (when * TP, TP)
    estimate: list[int] | int = (
        [int(v) for v in result.estimate]
        if isinstance(result.estimate, list)
        else int(result.estimate)
    )
    assert result.estimate == estimate  # exact: no DP in these tasks
    return estimate


# Each case on SQLite, and one on PostgreSQL too: a pair of servers each.
SQLITE = pytest.mark.parametrize("deployment", ["sqlite"], indirect=True)
BOTH = pytest.mark.parametrize(
    "deployment",
    ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
    indirect=True,
)


@SQLITE
def test_count_is_collected_exactly_over_dap(deployment: Deployment) -> None:
    assert _collect(deployment, "count", [1, 0, 1, 1, 0]) == 3


@BOTH
def test_histogram_is_collected_exactly_over_dap(deployment: Deployment) -> None:
    assert _collect(deployment, "histogram", [0, 3, 3, 1, 3, 2]) == [1, 1, 1, 3]


@SQLITE
def test_sum_is_collected_exactly_over_dap(deployment: Deployment) -> None:
    assert _collect(deployment, "sum", [100, 0, 37, 1, 62]) == 200


@SQLITE
def test_sumvec_is_collected_exactly_over_dap(deployment: Deployment) -> None:
    vectors = [[7, 0, 3], [1, 1, 1], [0, 6, 7]]
    assert _collect(deployment, "sumvec", vectors) == [8, 7, 11]


@SQLITE
def test_the_cli_uploads_and_collects_over_dap(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """veil upload and veil collect on a DAP task's files: they pick DAP
    (DapClient, DapCollector) from its [dap] table. Another batch than
    test_count's: two hours back, an invalid value first refused."""
    files = deployment.tasks["count"]
    for role in ("client", "collector"):
        write_toml(tmp_path / f"{role}.toml", getattr(files, role).to_dict(), secret=True)
    start = (int(time.time()) // TP - 2) * TP
    client, collector = str(tmp_path / "client.toml"), str(tmp_path / "collector.toml")
    # --time inside the hour, rounded down as over gRPC.
    assert main(["upload", "--task", client, "--time", str(start + 5), "1", "2"]) == 2
    assert "invalid measurement: value 2" in capsys.readouterr().err
    assert main(["upload", "--task", client, "--time", str(start + 5), "1", "0", "1", "1"]) == 0
    assert capsys.readouterr().out.strip() == "uploaded 4 reports (0 already stored)"
    batch = ["--task", collector, "--start", format_time(start), "--wait", "120"]
    assert main(["collect", *batch]) == 0
    got = capsys.readouterr()
    out = json.loads(got.out)
    assert out["batch"]["start"] == start and out["report_count"] == 4
    assert out["estimate"] == 3 and out["noise_added_by"] == []  # mechanism none: no noise
    # The leader's job, told as it was created, and resumed by its id: the
    # same answer, polled from its resource.
    job = out["collection_job_id"]
    assert len(bytes.fromhex(job)) == 16
    assert f"collection job {job} (to resume: --job-id {job})" in got.err
    assert main(["collect", *batch, "--job-id", job]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["collection_job_id"], again["estimate"], again["report_count"]) == (job, 3, 4)
    # The job is this task's: the leader-selected task holds no job of that
    # id, and the next hour's batch is not this job's.
    write_toml(
        tmp_path / "chosen.toml", deployment.tasks["chosen"].collector.to_dict(), secret=True
    )
    assert main(["collect", "--task", str(tmp_path / "chosen.toml"), "--job-id", job]) == 1
    assert f"no collection job {job} in this task" in capsys.readouterr().err
    later = ["--start", format_time(start + TP), "--job-id", job]
    assert main(["collect", "--task", collector, *later]) == 1
    assert f"was collection job {job} created for the batch" in capsys.readouterr().err


def _next_batch(files: TaskFiles, deadline: float) -> Any:
    """The next batch the leader chose, asked again while it has none ready
    (its driver forms the batches from the stored uploads)."""
    with collector_for(files.collector) as collector:
        assert isinstance(collector, DapCollector)
        while True:
            try:
                return collector.collect_next(wait=120)
            except CollectionError as e:
                if "invalidBatchSize" not in str(e) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)


@BOTH
def test_leader_selected_batches_are_formed_and_collected_once_each(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two batches of min_batch_size (3) reports each, formed by the leader
    as the uploads come and collected one after the other, each exactly;
    then no batch is ready (one report waits for two more), and the
    collector is refused with invalidBatchSize; veil collect takes the third
    once it is full."""
    files = deployment.tasks["chosen"]
    now = int(time.time()) // TP * TP
    deadline = time.monotonic() + 120
    results = []
    for values in ([1, 0, 1], [1, 1, 1]):
        with client_for(files.client) as client:
            assert client.upload_batch(values, report_time=now).accepted == 3
        results.append(_next_batch(files, deadline))
    assert [(r.report_count, r.estimate) for r in results] == [(3, 2), (3, 3)]
    ids = {r.collection_job_id for r in results}
    assert len(ids) == 2 and None not in ids
    # The leader's answer names the task's window (here every time), not the
    # reports' times.
    assert results[0].start == 0 and results[0].duration >= 2**62
    with client_for(files.client) as client:
        assert client.upload_batch([1], report_time=now).accepted == 1
    with pytest.raises(CollectionError, match="invalidBatchSize") as refused:
        DapCollector(files.collector).collect_next(wait=30)
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    # The other mode's calls are refused before any request.
    with pytest.raises(ValueError, match="leader-selected"):
        DapCollector(files.collector).collect(now, TP)

    # veil collect takes the next batch once two more reports fill it, and
    # refuses an option naming a batch.
    write_toml(tmp_path / "collector.toml", files.collector.to_dict(), secret=True)
    collector = str(tmp_path / "collector.toml")
    for option in (["--start", format_time(now)], ["--duration", str(TP)], ["--include-open"]):
        assert main(["collect", "--task", collector, *option]) == 2
        assert "this task is leader-selected" in capsys.readouterr().err
    with client_for(files.client) as client:
        assert client.upload_batch([0, 1], report_time=now).accepted == 2
    while True:
        code = main(["collect", "--task", collector, "--wait", "120"])
        if code == 0 or time.monotonic() > deadline:
            break
        assert "invalidBatchSize" in capsys.readouterr().err
        time.sleep(0.2)
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["report_count"], out["estimate"]) == (3, 2)
    assert len(bytes.fromhex(out["collection_job_id"])) == 16
    assert out["collection_job_id"] not in {i.hex() for i in ids if i is not None}
    # --job-id polls that job again: its batch, not the next (none is ready).
    job = out["collection_job_id"]
    assert main(["collect", "--task", collector, "--job-id", job, "--wait", "30"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["collection_job_id"], again["report_count"], again["estimate"]) == (job, 3, 2)
    # veil status shows each server's leader-selected batches by their ids.
    task_id = files.leader.id_text
    for role in ("leader", "helper"):
        config = str(deployment.root / f"{role}.toml")
        assert main(["status", "--config", config, "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        (chosen,) = (t for t in status["tasks"] if t["task_id"] == task_id)
        states = [(b["state"], b["aggregated"]) for b in chosen["batches"] if "batch_id" in b]
        assert states == [("collected", 3)] * 3
        assert all(b["start_utc"] is None for b in chosen["batches"])
        if role == "leader":  # its reports, counted by state
            assert chosen["reports"] == {"aggregated": 9}
        assert main(["status", "--config", config]) == 0
        assert capsys.readouterr().out.count("  batch ") >= 3


@BOTH
def test_leader_selected_batches_with_dp_are_charged_once_each(deployment: Deployment) -> None:
    """With DP (geometric, ε = 1, a budget of one collection): two batches
    of disjoint reports are each released with noise, charged once and in
    parallel, so both fit the budget."""
    files = deployment.tasks["chosen_dp"]
    now = int(time.time()) // TP * TP
    deadline = time.monotonic() + 120
    for _ in range(2):
        with client_for(files.client) as client:
            assert client.upload_batch([1, 1, 0], report_time=now).accepted == 3
        result = _next_batch(files, deadline)
        assert result.report_count == 3 and result.mechanism == "geometric"
        assert result.noise_added_by == ("leader", "helper") and result.spent == 1

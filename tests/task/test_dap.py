"""A task served over DAP: its [dap] table in every party's file, what is
refused, and DAP's TaskConfiguration built from the task
(draft-ietf-ppm-dap section 4.2)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from veil.aggregator.run.config import ConfigError, load_config, tasks_of_role
from veil.dap.messages import BatchMode, Interval, TaskConfiguration, VdafConfig
from veil.dap.versions import DapVersion
from veil.dp.accounting import Guarantee
from veil.settings import SettingsError
from veil.survey.statement import privacy_statement
from veil.task import (
    DapSpec,
    DpSpec,
    HelperTask,
    LeaderTask,
    TaskError,
    TaskFiles,
    VdafSpec,
    load_task,
    new_task,
    write_toml,
)

DAP = DapSpec("https://leader.example/dap/", "https://helper.example/", task_info="info")
SUM = VdafSpec("sum", max_measurement=9)
ROLES = ("leader", "helper", "collector", "client")


def _files(vdaf: VdafSpec = SUM, **kw: Any) -> TaskFiles:
    return new_task(
        vdaf,
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=10,
        **({"dap": DAP, "dp": DpSpec("geometric", epsilon="1")} | kw),
    )


@pytest.mark.parametrize("role", ["leader", "helper", "collector", "client"])
def test_every_role_keeps_the_table(tmp_path: Path, role: str) -> None:
    task = getattr(_files(), role)
    write_toml(tmp_path / "t.toml", task.to_dict(), secret=True)
    text = (tmp_path / "t.toml").read_text()
    assert "[dap]" in text and 'version = "dap-19"' in text
    loaded = load_task(tmp_path / "t.toml")
    assert loaded == task and loaded.dap == DAP


def test_the_task_configuration() -> None:
    task = _files().client
    assert task.dap_configuration() == TaskConfiguration(
        task_info=b"info",
        leader_aggregator_endpoint=b"https://leader.example/dap/",
        helper_aggregator_endpoint=b"https://helper.example/",
        time_precision=3600,
        min_batch_size=10,
        batch_mode=BatchMode.TIME_INTERVAL,
        vdaf_type=2,
        vdaf_configuration=VdafConfig("Prio3Sum", (("max_measurement", 9),)).encode(),
    )
    # A bounded window is the task_interval extension, in whole time precisions.
    windowed = _files(not_before=3600 * 10 + 5, not_after=3600 * 20 + 1).client
    assert windowed.dap_configuration().task_interval() == Interval(10, 11)
    multihot = _files(VdafSpec("multihot", length=5, max_weight=2, chunk_length=3)).client
    config = multihot.dap_configuration()
    assert VdafConfig.decode(config.vdaf_type, config.vdaf_configuration) == VdafConfig(
        "Prio3MultihotCountVec", (("length", 5), ("chunk_length", 3), ("max_weight", 2))
    )
    with pytest.raises(TaskError, match="not served over DAP"):
        _files(dap=None).client.dap_configuration()


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: DapSpec("https://l/", "https://h/", "dap-20"), "unknown DAP version 'dap-20'"),
        (lambda: DapSpec("https://l/", "https://h/", "dap-18"), "dap-18 needs a task_info"),
        (lambda: DapSpec("https://l é/", "https://h/"), "leader_endpoint must be a URL"),
        (lambda: DapSpec("https://l/", ""), "helper_endpoint must be a URL"),
        (lambda: DapSpec("https://l/", "https://h/", task_info="x" * 256), "at most 255"),
        (
            lambda: _files(VdafSpec("poplar1", bits=16)),
            "a poplar1 task cannot be served over DAP yet",
        ),
        (
            lambda: _files(VdafSpec("l1boundsum", length=3, max_value=4, chunk_length=1)),
            "a l1boundsum task cannot be served over DAP yet",
        ),
    ],
)
def test_refused(make: Any, error: str) -> None:
    with pytest.raises(TaskError, match=error):
        make()


def test_an_unknown_setting_in_the_table_is_refused(tmp_path: Path) -> None:
    d = _files().leader.to_dict()
    d["dap"]["endpoint"] = "x"
    write_toml(tmp_path / "t.toml", d, secret=True)
    with pytest.raises(SettingsError, match="unknown setting 'endpoint' in \\[dap\\]"):
        load_task(tmp_path / "t.toml")


def test_dap_18_keeps_its_version(tmp_path: Path) -> None:
    spec = DapSpec("https://l/", "https://h/", "dap-18", "i")
    task = _files(dap=spec).helper
    assert task.dap is not None and task.dap.dap_version is DapVersion.DAP_18
    write_toml(tmp_path / "t.toml", task.to_dict(), secret=True)
    assert load_task(tmp_path / "t.toml") == task


@pytest.mark.parametrize(
    ("dap", "error"),
    [
        ({"listen": "10.1.2.3:8080"}, "refusing to serve DAP on 10.1.2.3:8080 without TLS"),
        ({"listen": "8080"}, "is not host:port"),
        ({"listen": "127.0.0.1:8080", "port": 1}, "unknown setting 'port'"),
    ],
)
def test_the_servers_dap_table(tmp_path: Path, dap: dict[str, Any], error: str) -> None:
    write_toml(
        tmp_path / "leader.toml",
        {"listen": "127.0.0.1:7001", "storage": "l.db", "dap": dap},
        secret=False,
    )
    with pytest.raises(ConfigError, match=error):
        load_config(tmp_path / "leader.toml")
    write_toml(
        tmp_path / "ok.toml",
        {"listen": "127.0.0.1:7001", "storage": "l.db", "dap": {"listen": "[::1]:8080"}},
        secret=False,
    )
    assert load_config(tmp_path / "ok.toml").dap_listen == "[::1]:8080"


# --------------------------------------------------------------------------- another implementation


def _other(role: str | None, dp: DpSpec | None = None) -> TaskFiles:
    spec = DapSpec("https://l/", "https://h/", other_implementation=role)
    return _files(dap=spec, **({"dp": dp} if dp else {}))


@pytest.mark.parametrize("role", ["leader", "helper"])
def test_another_implementation_keeps_its_role_in_the_files(tmp_path: Path, role: str) -> None:
    for task in (_other(role).leader, _other(role).collector):
        write_toml(tmp_path / "t.toml", task.to_dict(), secret=True)
        assert f'other_implementation = "{role}"' in (tmp_path / "t.toml").read_text()
        assert load_task(tmp_path / "t.toml") == task
    veil = "helper" if role == "leader" else "leader"
    assert _other(role).client.noise_added_by == (veil,)
    # Both veil: the key is not written and both add noise.
    assert "other_implementation" not in _other(None).leader.to_dict()["dap"]
    assert _other(None).client.noise_added_by == ("leader", "helper")


@pytest.mark.parametrize("value", ["", "other", "Helper", "both", "veil", "helper "])
def test_an_unknown_other_implementation_is_refused(value: str) -> None:
    with pytest.raises(TaskError, match="other_implementation must be one of leader, helper"):
        DapSpec("https://l/", "https://h/", other_implementation=value)


@pytest.mark.parametrize("value", [1, True, ["helper"], {"role": "helper"}])
def test_an_other_implementation_of_another_type_is_refused(tmp_path: Path, value: Any) -> None:
    d = _files().leader.to_dict()
    d["dap"]["other_implementation"] = value
    write_toml(tmp_path / "t.toml", d, secret=True)
    with pytest.raises(SettingsError, match="'other_implementation' in \\[dap\\] must be a string"):
        load_task(tmp_path / "t.toml")


# --------------------------------------------------------------------------- batch modes


def test_a_leader_selected_task_keeps_its_mode_and_binds_it(tmp_path: Path) -> None:
    spec = DapSpec("https://l/", "https://h/", batch_mode="leader-selected")
    files = _files(dap=spec)
    for task in (files.leader, files.helper, files.client):
        write_toml(tmp_path / "t.toml", task.to_dict(), secret=True)
        assert 'batch_mode = "leader-selected"' in (tmp_path / "t.toml").read_text()
        assert load_task(tmp_path / "t.toml") == task
    config = files.client.dap_configuration()
    # Batch mode 2 with an empty batch_config (section 4.2), bound into every
    # share's associated data with the rest of the configuration.
    interval = _files(dap=DapSpec("https://l/", "https://h/")).client.dap_configuration()
    assert config.batch_mode is BatchMode.LEADER_SELECTED and config.batch_config == b""
    assert config == replace(interval, batch_mode=BatchMode.LEADER_SELECTED)
    encoded = config.encode(DapVersion.DAP_19)
    assert encoded != interval.encode(DapVersion.DAP_19)
    assert TaskConfiguration.decode(encoded, DapVersion.DAP_19) == config


def test_both_servers_serve_a_leader_selected_task(tmp_path: Path) -> None:
    files = _files(dap=DapSpec("https://l/", "https://h/", batch_mode="leader-selected"))
    for role, kind in (("leader", LeaderTask), ("helper", HelperTask)):
        write_toml(tmp_path / f"t.{role}.toml", getattr(files, role).to_dict(), secret=True)
        write_toml(
            tmp_path / f"{role}.toml",
            {"listen": "127.0.0.1:7001", "storage": f"{role}.db", "tasks": [f"t.{role}.toml"]},
            secret=False,
        )
        config = load_config(tmp_path / f"{role}.toml")
        assert list(tasks_of_role(config, kind)) == [files.leader.task_id]


@pytest.mark.parametrize("value", ["", "fixed-size", "leader_selected", "Time-Interval", "2"])
def test_an_unknown_batch_mode_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(TaskError, match="batch_mode must be one of time-interval, leader-selected"):
        DapSpec("https://l/", "https://h/", batch_mode=value)
    d = _files().leader.to_dict()
    d["dap"]["batch_mode"] = value
    write_toml(tmp_path / "t.toml", d, secret=True)
    with pytest.raises(SettingsError, match="batch_mode must be one of"):
        load_task(tmp_path / "t.toml")
    d["dap"]["batch_mode"] = 2
    write_toml(tmp_path / "t.toml", d, secret=True)
    with pytest.raises(SettingsError, match="'batch_mode' in \\[dap\\] must be a string"):
        load_task(tmp_path / "t.toml")


def _leader_selected(other: str | None = None, **kw: Any) -> TaskFiles:
    spec = DapSpec("https://l/", "https://h/", batch_mode="leader-selected")
    return _files(dap=replace(spec, other_implementation=other), **kw)


def _retiring(age: int, tp: int, skew: int) -> str:
    return re.escape(
        f"report_expiry_age = {age} is no larger than the larger of time_precision = {tp}"
        f" and max_clock_skew = {skew}: the leader of a leader-selected task retires a batch"
        f" once its oldest report is within {max(tp, skew)} s of expiry, so every batch would"
        f" retire as it is made; set report_expiry_age well above {max(tp, skew)}"
    )


@pytest.mark.parametrize(
    ("tp", "skew", "age"), [(3600, 60, 3600), (3600, 60, 61), (60, 600, 600), (60, 600, 1)]
)
def test_a_leader_selected_task_expiring_within_its_batches_margin_is_refused(
    tp: int, skew: int, age: int
) -> None:
    """veil's leader retires a batch once its oldest report is within
    max(time_precision, max_clock_skew) of report_expiry_age
    (store.batches.joinable_from): with an expiry no larger, every batch
    retired at birth unless its first job filled it."""
    times = {"time_precision": tp, "max_clock_skew": skew}
    with pytest.raises(TaskError, match=_retiring(age, tp, skew)):
        _leader_selected(**times, report_expiry_age=age)
    # A second more, and a batch takes jobs for a second.
    margin = max(tp, skew)
    assert _leader_selected(**times, report_expiry_age=margin + 1).leader.report_expiry_age
    # No batch retires in the other mode, nor at another implementation's leader.
    assert _files(**times, report_expiry_age=age).leader.report_expiry_age == age
    assert _leader_selected("leader", **times, report_expiry_age=age).helper.report_expiry_age


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"report_expiry_age": 3600}, _retiring(3600, 3600, 60)),
        ({"time_precision": 7200}, _retiring(3601, 7200, 60)),
        ({"max_clock_skew": 86400}, _retiring(3601, 3600, 86400)),
        ({"batch_mode": "leader-selected"}, _retiring(60, 3600, 60)),
    ],
    ids=["expiry", "precision", "skew", "mode"],
)
def test_a_task_file_expiring_within_its_batches_margin_stops_its_servers_start(
    tmp_path: Path, edit: dict[str, Any], says: str
) -> None:
    """A task file edited on disk into a leader-selected task whose batches
    would retire at birth is refused where it is read, naming the file, and
    a server listing it does not start: it stores nothing."""
    # The mode's case is a time-interval task whose reports expire in a minute.
    mode, age = ("time-interval", 60) if "batch_mode" in edit else ("leader-selected", 3601)
    files = _files(dap=DapSpec("https://l/", "https://h/", batch_mode=mode), report_expiry_age=age)
    for role in ROLES:
        d = getattr(files, role).to_dict()
        for key, value in edit.items():
            (d["dap"] if key == "batch_mode" else d)[key] = value
        write_toml(tmp_path / f"t.{role}.toml", d, secret=True)
        with pytest.raises(SettingsError, match=f"t\\.{role}\\.toml.*: {says}"):
            load_task(tmp_path / f"t.{role}.toml")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{held.getsockname()[1]}"
    for role in ("leader", "helper"):
        config = tmp_path / f"{role}.toml"
        write_toml(
            config,
            {"listen": listen, "storage": f"{role}.db", "tasks": [f"t.{role}.toml"]},
            secret=False,
        )
        done = subprocess.run(
            [sys.executable, "-m", "veil.cli", role, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert re.match(f"veil {role}: .*t\\.{role}\\.toml.*: {says}", last), last
    written = {f"t.{role}.toml" for role in ROLES} | {"leader.toml", "helper.toml"}
    assert {p.name for p in tmp_path.iterdir()} == written


def test_split_mode_with_another_implementation_is_refused() -> None:
    split = DpSpec("geometric", epsilon="1", mode="split", split_opt_in=True)
    assert _other(None, split).client.noise_added_by == ("leader", "helper")
    with pytest.raises(TaskError, match="use independent mode"):
        _other("helper", split)


def test_the_statement_says_who_adds_noise() -> None:
    both = privacy_statement(_other(None).client)
    assert both.against_collector == Guarantee.pure(1)
    assert both.against_collector_and_one_aggregator == Guarantee.pure(1)
    assert "noise_added_by" not in both.to_json()
    assert both.to_json()["covers"]["against_collector_and_one_aggregator"] == ["values"]
    # The helper is another implementation: the leader adds the whole noise, so
    # against the collector (and the collector with the helper) ε is unchanged;
    # with the leader, which knows all the noise, there is none.
    task = _other("helper").client
    statement = privacy_statement(task)
    assert statement.against_collector == Guarantee.pure(1)
    assert statement.against_collector_and_one_aggregator.is_none
    out = statement.to_json()
    assert out["noise_added_by"] == ["leader"]
    assert out["against_collector_and_helper"] == Guarantee.pure(1).to_json()
    assert out["against_collector_and_leader"] == Guarantee.no_privacy().to_json()
    assert out["ledgers_charge"] == "against_collector"
    assert out["covers"]["against_collector_and_one_aggregator"] == []
    text = statement.text()
    assert "Only the leader (veil) adds noise; the helper runs another DAP implementation" in text
    assert "Against the collector together with the helper (which adds no noise): ε = 1" in text
    with_leader = "Against the collector together with the leader (which adds all of it): no "
    assert with_leader + "differential privacy" in text
    assert "one of the two aggregators" not in text
    assert privacy_statement(_other("leader").client).to_json()["noise_added_by"] == ["helper"]
    # What the ledgers charge is what they charged with two veil aggregators.
    assert task.dp.charge(task.vdaf) == _other(None).client.dp.charge(task.vdaf)


def test_the_collectors_noise_is_what_veil_adds() -> None:
    both, one = _other(None).client.noise_plan(), _other("helper").client.noise_plan()
    assert one.server_noise() == both.server_noise()
    assert len(both.total_noise().parts) == 2 and len(one.total_noise().parts) == 1
    assert one.total_noise().variance() == pytest.approx(both.total_noise().variance() / 2)

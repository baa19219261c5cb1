"""A task served over DAP: its [dap] table in every party's file, what is
refused, and DAP's TaskConfiguration built from the task
(draft-ietf-ppm-dap section 4.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from veil.aggregator.run.config import ConfigError, load_config
from veil.dap.messages import BatchMode, Interval, TaskConfiguration, VdafConfig
from veil.dap.versions import DapVersion
from veil.settings import SettingsError
from veil.task import (
    DapSpec,
    DpSpec,
    TaskError,
    TaskFiles,
    VdafSpec,
    load_task,
    new_task,
    write_toml,
)

DAP = DapSpec("https://leader.example/dap/", "https://helper.example/", task_info="info")
SUM = VdafSpec("sum", max_measurement=9)


def _files(vdaf: VdafSpec = SUM, **kw: Any) -> TaskFiles:
    return new_task(
        vdaf,
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=10,
        dp=DpSpec("geometric", epsilon="1"),
        **({"dap": DAP} | kw),
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

"""docs/DEPLOYING.md's "Running the servers by hand", run as written: `veil
task new`, the helper and the leader from the configs it wrote, uploads and
`veil collect`; then, in the same folder with the servers running,
docs/OPERATING.md's key rotation commands, and docs/CONFIGURATION.md's server
configuration and DEPLOYING.md's PostgreSQL settings read by the servers'
own configuration reader.

Only the ports are free ones, the servers the document starts in two
terminals are started by the test, and instead of `sleep 60` the test waits
until the minute of the uploads is over, so that `veil collect`, however
slowly it starts on a loaded machine, finds that minute the last complete
interval; the key rotation follows the collection."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.docs import section_blocks
from veil.aggregator.run import config as server_config
from veil.aggregator.run.config import load_config
from veil.local.launcher import ServerProcess, free_port

pytestmark = pytest.mark.slow

DOC = "docs/DEPLOYING.md"
PRECISION = 60


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_running_the_servers_by_hand_as_written(tmp_path: Path) -> None:
    task_new, servers, upload = (b.code for b in section_blocks(DOC, "Running the servers by hand"))
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    assert f"--time-precision {PRECISION}" in task_new and "127.0.0.1:7001" in task_new
    task_new = task_new.replace("127.0.0.1:7001", leader).replace("127.0.0.1:7002", helper)
    done = bash(task_new, tmp_path)
    assert done.returncode == 0, done.stderr
    demo = tmp_path / "demo"
    assert (demo / "tasks" / "ages.client.toml").is_file()

    assert servers == "veil helper --config helper.toml\nveil leader --config leader.toml\n"
    processes = [
        ServerProcess(role, demo / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    try:
        for server in processes:
            server.start()
        # The uploads, then the wait for their interval to end, then collect.
        uploads, wait, collect = upload.partition("sleep 60\n")
        assert wait and "veil collect" in collect
        # All the uploads in one interval, as a user typing them would have
        # them: with less than half an interval left, start at the next (the
        # reports of uploads that straddled an interval's end fell short of
        # min_batch_size on each side).
        left = PRECISION - time.time() % PRECISION
        if left < PRECISION / 2:
            time.sleep(left + 0.5)
        times = []
        for line in uploads.splitlines():
            times.append(time.time())
            done = bash(line, demo)
            assert done.returncode == 0, done.stderr
            times.append(time.time())
        time.sleep(max(0.0, (times[-1] // PRECISION + 1) * PRECISION + 0.5 - time.time()))
        done = bash(collect, demo)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        # The last complete interval: all six reports when both uploads ran
        # within one minute; when they crossed into the next (each command
        # takes its report time as it runs), three or six.
        one_interval = len({int(t // PRECISION) for t in times}) == 1
        expected = {6} if one_interval else {3, 6}
        assert result["report_count"] in expected, (result, times)
        assert result["spent"] == {"epsilon": "1"}, result
        # The key rotation after the collection, not while its minute ends:
        # on a loaded machine its eight commands took longer than the rest of
        # the minute, and `veil collect` then found a later, empty interval.
        rotate_keys(demo)
    finally:
        for server in processes:
            server.stop()

    check_configuration_reference(demo)
    check_postgresql_settings(demo)


def rotate_keys(demo: Path) -> None:
    """docs/OPERATING.md's four commands; the key activated by hand is the one
    the first command added (the document's 42 stands for its id)."""
    (block,) = section_blocks("docs/OPERATING.md", "HPKE key rotation", "sh")
    lines = [line.split("#", 1)[0].strip() for line in block.code.splitlines()]
    assert len(lines) == 4 and lines[2].endswith(" 42")

    def key_ids() -> dict[int, str]:
        done = bash("veil keys list --config leader.toml --json", demo)
        assert done.returncode == 0, done.stderr
        return {k["config_id"]: k["state"] for k in json.loads(done.stdout)}

    before = key_ids()
    done = bash(lines[0], demo)
    assert done.returncode == 0, done.stderr
    (pending,) = set(key_ids()) - set(before)
    assert key_ids()[pending] == "pending"
    done = bash(lines[1], demo)
    assert done.returncode == 0, done.stderr
    done = bash(lines[2].replace(" 42", f" {pending}"), demo)
    assert done.returncode == 0, done.stderr
    assert key_ids()[pending] == "active"
    done = bash(lines[3], demo)
    assert done.returncode == 0, done.stderr
    assert str(pending) in done.stdout


def check_configuration_reference(demo: Path) -> None:
    """The reference configuration is one the server reads, and each value it
    shows for a setting with a default is that default."""
    (block,) = section_blocks("docs/CONFIGURATION.md", "Server configuration", "toml")
    (demo / "reference.toml").write_text(block.code)
    shown = load_config(demo / "reference.toml")
    defaults = load_config(demo / "leader.toml")  # as written: listen, storage, tasks
    examples = {
        "listen",
        "storage",
        "tls",
        "helper_tls",
        "metrics_listen",
        "log_level",
        "dap_listen",
    }
    for field in dataclasses.fields(shown):
        if field.name not in examples:
            assert getattr(shown, field.name) == getattr(defaults, field.name), field.name
    # Unset, the level falls back to info (after VEIL_LOG_LEVEL and --log-level).
    assert defaults.log_level is None and shown.log_level == "info"
    assert shown.metrics_listen == "127.0.0.1:9101"
    # Every setting the reader knows is shown, in every table.
    doc = tomllib.loads(block.code)
    assert set(doc) == set(server_config.CONFIG_KEYS)
    tables = {
        "tls": server_config.TLS_KEYS,
        "helper_tls": server_config.HELPER_TLS_KEYS,
        "driver": server_config.DRIVER_KEYS,
        "admission": server_config.ADMISSION_KEYS,
        "metrics": server_config.METRICS_KEYS,
        "gc": server_config.GC_KEYS,
        "keys": server_config.KEYS_KEYS,
        "connections": server_config.CONNECTIONS_KEYS,
        "dap": server_config.DAP_KEYS,
    }
    for table, keys in tables.items():
        assert set(doc[table]) == set(keys), table


def check_postgresql_settings(demo: Path) -> None:
    """DEPLOYING.md's PostgreSQL lines, in place of the leader's storage."""
    (block,) = section_blocks(DOC, "Scaling out on PostgreSQL", "toml")
    written = (demo / "leader.toml").read_text()
    config = re.sub(r"^storage = .*\n", "", written, flags=re.M) + block.code
    (demo / "postgres.toml").write_text(config)
    read = load_config(demo / "postgres.toml")
    assert read.storage == "postgresql://veil@db.internal/leader"
    assert read.driver_enabled is False
    assert read.pool_size == 8  # what the comment says

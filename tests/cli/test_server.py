"""`veil keys`, `veil gc` and `veil status` against a database, without servers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.backends import Backend
from veil.aggregator.maintenance import ensure_active_key
from veil.aggregator.run.config import ConfigError, load_config
from veil.cli import main


@pytest.fixture
def config(backend: Backend, tmp_path: Path) -> Path:
    """A leader config and its database with one key, on each backend."""
    path = tmp_path / "leader.toml"
    storage = backend.storage_setting("leader")
    store = backend.store("leader", pool_size=1)
    path.write_text(
        f'listen = "127.0.0.1:1"\nstorage = "{storage}"\ntasks = []\n'
        "[keys]\npending_seconds = 30\ngrace_seconds = 100\n"
    )
    ensure_active_key(store, time.time())
    return path


def keys(config: Path, capsys: pytest.CaptureFixture[str]) -> dict[int, str]:
    assert main(["keys", "list", "--json", "--config", str(config)]) == 0
    return {k["config_id"]: k["state"] for k in json.loads(capsys.readouterr().out)}


def test_rotate_then_activate_by_hand(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (first,) = keys(config, capsys)
    assert main(["keys", "rotate", "--config", str(config)]) == 0
    assert "after 30 s" in capsys.readouterr().out
    states = keys(config, capsys)
    (new,) = [i for i, s in states.items() if s == "pending"]
    assert states == {first: "active", new: "pending"}
    assert main(["keys", "activate", "--config", str(config), str(new)]) == 0
    assert "expires in 100 s" in capsys.readouterr().out
    assert keys(config, capsys) == {first: "expired", new: "active"}
    # An expired key cannot come back.
    assert main(["keys", "activate", "--config", str(config), str(first)]) == 1
    assert "not a pending or active key" in capsys.readouterr().err

    assert main(["status", "--json", "--config", str(config)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [(k["config_id"], k["advertised"]) for k in status["hpke_keys"]] == [
        (first, False),
        (new, True),
    ]
    assert main(["gc", "--json", "--config", str(config)]) == 0
    gc = json.loads(capsys.readouterr().out)
    assert gc["deleted"] == {} and gc["bytes_after"] > 0


def test_commands_need_an_existing_database(tmp_path: Path) -> None:
    path = tmp_path / "helper.toml"
    path.write_text('listen = "127.0.0.1:1"\nstorage = "nowhere.db"\n')
    for command in (["status"], ["gc"], ["keys", "list"]):
        assert main([*command, "--config", str(path)]) == 2
    assert not (tmp_path / "nowhere.db").exists()


def test_unknown_maintenance_settings_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "leader.toml"
    path.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\n[gc]\nintervall = 5\n')
    with pytest.raises(ConfigError, match=r"intervall.*\[gc\]"):
        load_config(path)
    path.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\n[keys]\ngrace_seconds = -1\n')
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config(path)


def test_a_server_on_a_port_in_use_names_the_address(tmp_path: Path) -> None:
    # It said only "cannot listen on 127.0.0.1:7102" (gRPC gives no reason).
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        address = f"127.0.0.1:{held.getsockname()[1]}"
        config = tmp_path / "helper.toml"
        config.write_text(f'listen = "{address}"\nstorage = "h.db"\n')
        done = subprocess.run(
            [sys.executable, "-m", "veil.cli", "helper", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last == f"veil helper: cannot listen on {address}: the address is in use by another process"
    )

"""Role-typed task files: each party's task has its own type with exactly its
secrets, required, and the file declares its role instead of having it guessed
from which secrets are present."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from veil.aggregator.run.config import ConfigError, load_config, tasks_of_role
from veil.task import (
    ClientTask,
    CollectorTask,
    DpSpec,
    HelperTask,
    LeaderTask,
    Task,
    TaskError,
    TaskFiles,
    VdafSpec,
    load_task,
    new_task,
    write_toml,
)

ROLE_TYPES = {
    "leader": LeaderTask,
    "helper": HelperTask,
    "collector": CollectorTask,
    "client": ClientTask,
}


@pytest.fixture(scope="module")
def files() -> TaskFiles:
    return new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=3,
        dp=DpSpec("geometric", epsilon="1"),
    )


def _write(tmp_path: Path, task: Task, name: str = "t.toml") -> Path:
    path = tmp_path / name
    write_toml(path, task.to_dict(), secret=True)
    return path


@pytest.mark.parametrize("role", list(ROLE_TYPES))
def test_each_role_round_trips_as_its_own_type(tmp_path: Path, files: TaskFiles, role: str) -> None:
    task = getattr(files, role)
    path = _write(tmp_path, task)
    assert path.read_text().startswith(f'role = "{role}"\n')
    loaded = load_task(path)
    assert type(loaded) is ROLE_TYPES[role] and loaded == task
    assert load_task(path, ROLE_TYPES[role]) == task
    assert task.public() == files.client and type(task.public()) is ClientTask


@pytest.mark.parametrize("role", ["leader", "helper", "collector", "client"])
def test_a_file_without_role_says_which_line_to_add(
    tmp_path: Path, files: TaskFiles, role: str
) -> None:
    path = _write(tmp_path, getattr(files, role))
    path.write_text(path.read_text().replace(f'role = "{role}"\n', ""))
    with pytest.raises(TaskError) as e:
        load_task(path)
    assert str(e.value).startswith(f"{path}: the task file does not say whose it is")
    assert f'add the line role = "{role}" at its top' in str(e.value)


def test_a_role_with_a_missing_secret_or_anothers_secret_is_refused(
    tmp_path: Path, files: TaskFiles
) -> None:
    path = _write(tmp_path, files.leader)
    text = path.read_text()
    path.write_text("\n".join(ln for ln in text.splitlines() if "aggregator_token" not in ln))
    with pytest.raises(TaskError, match="lacks the required setting 'aggregator_token'"):
        load_task(path)
    # A client file holding a secret is a mistake (one could publish it).
    path = _write(tmp_path, files.client)
    path.write_text('verify_key = "AAAA"\n' + path.read_text())
    with pytest.raises(TaskError, match=rf"{path}:1: unknown setting 'verify_key'"):
        load_task(path)
    path.write_text(text.replace('role = "leader"', 'role = "leeder"'))
    with pytest.raises(TaskError, match=r":1: role must be one of leader, helper"):
        load_task(path)


def test_a_file_of_another_role_is_refused_where_it_is_used(
    tmp_path: Path, files: TaskFiles
) -> None:
    client = _write(tmp_path, files.client, "client.toml")
    with pytest.raises(TaskError, match=r"client.toml: this is the client's task file"):
        load_task(client, CollectorTask)
    helper_file = _write(tmp_path, files.helper, "h.toml")
    config = tmp_path / "leader.toml"
    config.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\ntasks = ["h.toml"]\n')
    loaded = load_config(config)
    with pytest.raises(ConfigError, match=r"h.toml: this is the helper's task file"):
        tasks_of_role(loaded, LeaderTask)
    assert tasks_of_role(loaded, HelperTask) == {files.helper.task_id: files.helper}
    config.write_text('listen = "127.0.0.1:1"\nstorage = "l.db"\ntasks = ["client.toml"]\n')
    with pytest.raises(ConfigError, match="an aggregator needs its own"):
        load_config(config)
    assert helper_file.exists()


@pytest.mark.slow
def test_cli_refuses_files_of_the_wrong_role(tmp_path: Path, files: TaskFiles) -> None:
    _write(tmp_path, files.helper, "h.toml")
    _write(tmp_path, files.client, "client.toml")
    (tmp_path / "leader.toml").write_text(
        'listen = "127.0.0.1:0"\nstorage = "l.db"\ntasks = ["h.toml"]\n'
    )

    def veil(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "veil.cli", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    r = veil("leader", "--config", "leader.toml")
    assert r.returncode == 2 and "this is the helper's task file" in r.stderr, r.stderr
    assert not (tmp_path / "l.db").exists()
    r = veil("collect", "--task", "client.toml")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("veil collect: ") and "the collector needs its own" in r.stderr


def test_cli_user_mistakes_are_one_line_and_exit_2(
    tmp_path: Path, files: TaskFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    from veil.cli import main

    client = _write(tmp_path, files.client, "client.toml")
    cases = [
        ["upload", "--task", str(client), "--file", str(tmp_path / "none.txt")],
        ["upload", "--task", str(tmp_path / "none.toml"), "1"],
        ["collect", "--task", str(client)],
        ["status", "--config", str(tmp_path / "none.toml")],
    ]
    for argv in cases:
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code  # type: ignore[assignment]
        err = capsys.readouterr().err
        assert code == 2, argv
        assert err.startswith(f"veil {argv[0]}: ") and len(err.strip().splitlines()) == 1, err

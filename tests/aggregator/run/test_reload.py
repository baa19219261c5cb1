"""veil.aggregator.run.config.reload_tasks: what SIGHUP takes of a served
task's changed file (its window, after veil survey close or extend) and what
it refuses (anything else), with a real helper in process; and the helper's
refusal of a leader whose window differs (check_window_agrees)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from veil.aggregator.errors import WindowMismatch
from veil.aggregator.helper import Helper
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.config import ConfigError, load_config, reload_tasks
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.task import DpSpec, HelperTask, VdafSpec, new_task, write_toml
from veil.times import format_time

OPENS, CLOSES = 1_800_000_000, 1_800_086_400


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, Helper, PrivacyEngine, HelperTask, str]:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("geometric", "1"),
        not_before=OPENS,
        not_after=CLOSES,
    )
    write_toml(tmp_path / "task.toml", files.helper.to_dict(), secret=True)
    write_toml(
        tmp_path / "helper.toml",
        {"listen": "127.0.0.1:2", "storage": "helper.db", "tasks": ["task.toml"]},
        secret=False,
    )
    store = SqliteDatastore(str(tmp_path / "helper.db"))
    privacy = PrivacyEngine(str(tmp_path / "ledger.db"), [files.helper])
    helper = Helper({files.helper.task_id: files.helper}, store, privacy)
    return tmp_path, helper, privacy, files.helper, files.leader.aggregator_token


def test_a_new_window_is_served_and_said(
    served: tuple[Path, Helper, PrivacyEngine, HelperTask, str],
) -> None:
    root, helper, privacy, task, token = served
    # Heard at the logger itself: another test of the process may have
    # stopped veil's loggers from propagating to pytest's capture.
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("veil.aggregator.run.config")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    config = load_config(root / "helper.toml")
    closed = dataclasses.replace(task, not_after=CLOSES - 3600)
    write_toml(root / "task.toml", closed.to_dict(), secret=True)
    try:
        config, added = reload_tasks(root / "helper.toml", config, HelperTask, privacy, helper)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert added == []
    assert helper.task(task.task_id).window == (OPENS, CLOSES - 3600)
    assert [t.window for t in config.tasks] == [(OPENS, CLOSES - 3600)]
    assert (
        f"now takes reports from {format_time(OPENS)} to {format_time(CLOSES - 3600)}"
        f" (was {format_time(OPENS)} to {format_time(CLOSES)})"
    ) in " ".join(said)
    # The leader's window, once it is the same, is taken; the old one is
    # refused, retryably, naming both.
    helper.aggregate(task.task_id, token, bytes(16), [], window=closed.window)
    with pytest.raises(WindowMismatch) as refused:
        helper.aggregate(task.task_id, token, bytes(16), [], window=task.window)
    assert refused.value.retryable
    assert (
        f"another end: the leader's window is [{format_time(OPENS)}, {format_time(CLOSES)}),"
        f" the helper's [{format_time(OPENS)}, {format_time(CLOSES - 3600)})"
    ) in str(refused.value)


def test_any_other_change_is_refused_and_nothing_changes(
    served: tuple[Path, Helper, PrivacyEngine, HelperTask, str],
) -> None:
    root, helper, privacy, task, _ = served
    config = load_config(root / "helper.toml")
    changed = dataclasses.replace(task, not_after=CLOSES + 3600, min_batch_size=2)
    write_toml(root / "task.toml", changed.to_dict(), secret=True)
    with pytest.raises(ConfigError, match="changed in its file beyond its window"):
        reload_tasks(root / "helper.toml", config, HelperTask, privacy, helper)
    assert helper.task(task.task_id) == task

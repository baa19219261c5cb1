"""DP and the batch floor fail closed (issue 13, item 3): a task file states its
[dp] and min_batch_size, exact release is each aggregator's own opt-in, a
survey task names its survey budget, and ε and ρ have sensible bounds."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.deployment import Server, free_port
from veil.aggregator.privacy import ExactReleaseRefused, PrivacyEngine
from veil.aggregator.run.config import load_config
from veil.aggregator.status import gather, render_text
from veil.aggregator.store.ledger import sqlite_ledger
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.dp.mechanisms import MAX_EPSILON, MAX_RHO, MIN_EPSILON, MIN_RHO
from veil.task import DpSpec, TaskError, VdafSpec, load_task, new_task, write_toml


def test_a_task_file_without_dp_or_min_batch_size_is_refused(tmp_path: Path) -> None:
    """Before: no [dp] loaded as mechanism none, no min_batch_size as 1."""
    files = new_task(
        VdafSpec("count"), "a:1", "b:2", min_batch_size=5, dp=DpSpec("geometric", epsilon="1")
    )
    for key in ("dp", "min_batch_size"):
        d = files.helper.to_dict()
        del d[key]
        path = tmp_path / f"no-{key}.toml"
        write_toml(path, d, secret=True)
        with pytest.raises(TaskError, match=f"lacks the required setting '{key}'"):
            load_task(path)


def test_a_survey_task_names_its_survey_budget(tmp_path: Path) -> None:
    """Before: survey_budget silently defaulted to the task's own budget."""
    with pytest.raises(TaskError, match="no survey_budget"):
        DpSpec("geometric", epsilon="1", survey="s1")
    with pytest.raises(TaskError, match="survey_budget needs survey"):
        DpSpec("geometric", epsilon="1", survey_budget="2")
    files = new_task(
        VdafSpec("count"),
        "a:1",
        "b:2",
        min_batch_size=5,
        dp=DpSpec("geometric", epsilon="1", survey="s1", survey_budget="2"),
    )
    path = tmp_path / "t.toml"
    write_toml(path, files.helper.to_dict(), secret=True)
    path.write_text(path.read_text().replace('survey_budget = "2"\n', ""))
    with pytest.raises(TaskError, match=r"t.toml:\d+: .*no survey_budget"):
        load_task(path)


@pytest.mark.parametrize(
    ("dp", "message"),
    [
        (("geometric", "1e-30", None), "below the minimum 1/1000"),
        (("laplace", "0.0009", None), "below the minimum 1/1000"),
        (("geometric", "21", None), "above the maximum 20"),
        (("gaussian", None, "1e-30"), "below the minimum 1/2000000"),
        (("gaussian", None, "5"), "above the maximum 4"),
    ],
)
def test_epsilon_and_rho_have_bounds(dp: tuple[str, str | None, str | None], message: str) -> None:
    mechanism, epsilon, rho = dp
    with pytest.raises(TaskError, match=message):
        DpSpec(mechanism, epsilon=epsilon, rho=rho).config()


def test_rho_bounds_match_the_epsilon_bounds() -> None:
    # ρ-zCDP is (ρ + 2√(ρ ln(1/δ)), δ)-DP: at δ = 10**-6 the largest ρ stays
    # within the largest ε; ε-DP is (ε²/2)-zCDP: the smallest ρ is that of the
    # smallest ε.
    worst = float(MAX_RHO) + 2 * math.sqrt(float(MAX_RHO) * math.log(10**6))
    assert worst <= MAX_EPSILON
    assert MIN_RHO == MIN_EPSILON**2 / 2
    assert DpSpec("gaussian", rho=str(MAX_RHO)).config().rho == MAX_RHO
    assert DpSpec("geometric", epsilon=str(MIN_EPSILON)).config().epsilon == MIN_EPSILON


def test_exact_release_needs_the_aggregators_own_opt_in(tmp_path: Path) -> None:
    files = new_task(VdafSpec("count"), "a:1", "b:2", min_batch_size=5, dp=DpSpec("none"))
    with pytest.raises(ExactReleaseRefused, match="allow_exact_release = true"):
        PrivacyEngine(str(tmp_path / "h.db"), [files.helper])
    PrivacyEngine(str(tmp_path / "h.db"), [files.helper], allow_exact_release=True)


def _helper_setup(tmp_path: Path, allow: bool | None, role: str = "helper") -> tuple[Path, str]:
    addr = f"127.0.0.1:{free_port()}"
    files = new_task(VdafSpec("count"), addr, addr, min_batch_size=5, dp=DpSpec("none"))
    write_toml(tmp_path / f"t.{role}.toml", getattr(files, role).to_dict(), secret=True)
    config: dict[str, object] = {"listen": addr, "storage": "h.db", "tasks": [f"t.{role}.toml"]}
    if allow is not None:
        config["allow_exact_release"] = allow
    write_toml(tmp_path / f"{role}.toml", config, secret=False)
    return tmp_path / f"{role}.toml", addr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "allow"), [("helper", None), ("helper", False), ("leader", None), ("worker", None)]
)
def test_aggregator_without_opt_in_refuses_to_start(
    tmp_path: Path, command: str, allow: bool | None
) -> None:
    """Before: the helper started with a warning and released exact shares."""
    config, _ = _helper_setup(tmp_path, allow, "helper" if command == "helper" else "leader")
    r = subprocess.run(
        [sys.executable, "-m", "veil.cli", command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.startswith(f"veil {command}: task ")
    assert 'mechanism = "none"' in r.stderr and "allow_exact_release = true" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "h.db").exists()  # refused before anything was stored


@pytest.mark.slow
def test_helper_with_opt_in_serves_and_status_says_so(tmp_path: Path) -> None:
    config_path, addr = _helper_setup(tmp_path, True)
    server = Server("helper", config_path, tmp_path / "helper.log", addr)
    server.start()
    server.stop()
    config = load_config(config_path)
    store = SqliteDatastore(tmp_path / "h.db")
    try:
        status = gather("helper", config, store, sqlite_ledger(str(tmp_path / "h.db")))
    finally:
        store.close()
    assert status["allow_exact_release"] is True
    assert status["tasks"][0]["exact_release"] is True
    text = render_text(status)
    assert "exact release (mechanism none): allowed by this config" in text
    assert "EXACT RELEASE: no noise added" in text

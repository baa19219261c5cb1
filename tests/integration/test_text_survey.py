"""A text question end to end through a real leader and helper: deployed by
`veil survey deploy`'s function, answered by SurveyClient (what `veil survey
respond` and the outbox use), collected by `veil survey collect`'s function
level by level, stopped and resumed between levels, published; and one whose
first level fails. The two surveys are deployed together, open for an hour,
answered, and closed as soon as the respondents are done (the module's
fixture; tests/support/window.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import veil
from tests.support.text_survey import REMOTE, editors_survey
from tests.support.window import LONG_WINDOW, close_survey
from veil.client import Client
from veil.client.outbox import Outbox
from veil.client.survey import SurveyClient
from veil.collector.survey import collect_survey
from veil.deploy import Deployment, deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.survey import AnswerError, parse_survey

pytestmark = pytest.mark.slow

TP = 5
ANSWERS = ["Vim"] * 4 + [" nano"] * 3 + ["éd"] * 2 + ["once"]


@dataclass
class Surveys:
    """The module's two surveys, answered and closed: each one's collector/."""

    resumed: Path
    one_answer: Path


def deploy(root: Path, text: str, started: list[ServerProcess]) -> Deployment:
    """Deploy `text` under `root` (exact release allowed) and start its helper
    and leader, appending them to `started`."""
    leader_addr = f"127.0.0.1:{free_port()}"
    helper_addr = f"127.0.0.1:{free_port()}"
    dep = deploy_survey(parse_survey(text), text, root / "out", leader_addr, helper_addr, tls=False)
    for config in (dep.leader_config, dep.helper_config):
        config.write_text("allow_exact_release = true\n" + config.read_text())
    for role, config, addr in (
        ("helper", dep.helper_config, helper_addr),
        ("leader", dep.leader_config, leader_addr),
    ):
        server = ServerProcess(role, config, root / f"{role}.log", addr)
        started.append(server)
        server.start()
    return dep


@pytest.fixture(scope="module")
def surveys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Surveys]:
    """Both tests' surveys deployed with one window, answered, and closed: the
    first takes eleven answers (one through the outbox) of at most 5 bytes
    beside a yes/no question, the second one answer of at most 3 bytes."""
    now = int(time.time())
    opens = now - now % TP
    closes = opens + LONG_WINDOW
    root = tmp_path_factory.mktemp("text")
    started: list[ServerProcess] = []
    try:
        dep = deploy(
            root / "resumed", editors_survey(opens, closes, TP, max_bytes=5, more=REMOTE), started
        )
        once = deploy(root / "once", editors_survey(opens, closes, TP, max_bytes=3), started)
        with SurveyClient(dep.client_dir) as client:
            with pytest.raises(AnswerError, match="too long: 6 bytes"):
                client.respond({"editor": "emacs!"})
            client.respond_many({"editor": a, "remote": True} for a in ANSWERS)
            q = client.survey.question("editor")
            task = client.tasks["editor"]
        # One more through the durable outbox: sealed and committed before it is sent.
        with Client(task, outbox=root / "outbox.db") as outboxed:
            outboxed.upload_batch([q.to_measurement(" VIM")], outboxed.report_time())
        with Outbox(root / "outbox.db") as outbox:
            assert outbox.pending_count(task.task_id) == 0  # acknowledged, so gone
        description = json.loads((dep.client_dir / "survey.json").read_text())
        (editor,) = [q for q in description["questions"] if q["id"] == "editor"]
        assert (editor["max_bytes"], editor["case_sensitive"]) == (5, False)
        with SurveyClient(once.client_dir) as client:
            client.respond({"editor": "vim"})
        # Each deployment's helper and leader, in the order deploy started them.
        close_survey(dep.out, started[:2])
        close_survey(once.out, started[2:])
        yield Surveys(dep.collector_dir, once.collector_dir)
    finally:
        for server in reversed(started):
            server.stop()


def test_a_text_question_collected_level_by_level_and_resumed(
    surveys: Surveys, tmp_path: Path
) -> None:
    collector_dir = surveys.resumed
    out = tmp_path / "results"
    said: list[str] = []

    # Stop the run after the second level's job is saved: the state keeps it.
    class Stop(Exception):
        pass

    def say(line: str) -> None:
        said.append(line)
        if "byte 3 of 5" in line and not any("resumed" in s for s in said):
            raise Stop

    with pytest.raises(Stop):
        collect_survey(collector_dir, out, wait=60, say=say)
    state = json.loads((out / "state.json").read_text())
    assert state["text"]["editor"]["progress"]["done"] == 2
    said.append("resumed")
    outcome = collect_survey(collector_dir, out, wait=60, say=said.append)
    assert outcome.complete, outcome.pending
    results = json.loads((out / "results.json").read_text())
    (editor,) = [r for r in results if r["question"] == "editor"]
    rows = {row["label"]: row["estimate"] for row in editor["rows"]}
    # Mechanism none: the threshold is 2, so the answer given once is not released.
    assert rows == {"vim": 5, "nano": 3, "éd": 2}
    assert editor["threshold"] == 2 and editor["n"] == len(ANSWERS) + 1
    assert "vim" in (out / "report.html").read_text()
    assert "editor,text,11,vim,5" in (out / "results.csv").read_text()


def test_a_text_question_whose_level_failed_is_said_to_be_over(
    surveys: Surveys, tmp_path: Path
) -> None:
    """One respondent under a floor of two: the first level's collection
    fails at the leader, for good (each aggregator takes a level of a batch
    once). `veil survey collect` says the question cannot be collected and
    does not advise running again, which would only fail the same way."""
    out = tmp_path / "results"
    for _ in range(2):  # running again says the same
        done = veil("survey", "collect", "--survey-dir", surveys.one_answer, "--out", out)
        assert done.returncode == 1, done.stderr
        assert "editor cannot be collected: the collection of a level failed" in done.stderr
        assert "running again cannot collect this question" in done.stderr
        assert "run the same command again" not in done.stderr
    assert not (out / "results.json").exists()

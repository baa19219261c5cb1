"""A points question end to end, as its parties run it: `veil survey deploy`,
a real leader and helper, respondents answering with `veil survey respond` (a
JSON Lines panel, one person with --answer, one refused for a split over the
total before anything is sent), a hand-made report whose split is over the
total refused by both aggregators and never counted, `veil survey collect`,
and what it publishes (results.json, results.csv, report.html, the summary)."""

from __future__ import annotations

import csv
import io
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import veil
from tests.support.reports import encoded_report
from tests.support.window import LONG_WINDOW, close_survey
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import Client
from veil.local.launcher import ServerProcess, free_port
from veil.task import ClientTask, load_task
from veil.times import format_time
from veil.vdaf.spec.circuits import encode_range_checked_int

pytestmark = pytest.mark.slow

TP = 2
OPTIONS = ["training", "tools", "travel", "hiring"]
QUESTIONS = """
[[question]]
id = "remote"
text = "Do you work remotely most days?"
kind = "yes_no"

[[question]]
id = "budget"
text = "Split 100 points across what we should improve"
kind = "points"
options = ["training", "tools", "travel", "hiring"]
total = 100
"""
# Wide enough that the 5 intervals all hold the truth but once in about 10^6 runs.
CONFIDENCE = "0.9999999"


def panel(n: int, seed: int) -> list[dict[str, Any]]:
    """n respondents, each splitting at most 100 points, written in both forms a
    file takes (a table of option names, or a list in option order)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        cuts = sorted(rng.randrange(0, 101) for _ in range(3))
        split = [cuts[0], cuts[1] - cuts[0], cuts[2] - cuts[1], 100 - cuts[2]]
        if i % 5 == 0:
            split[3] = 0  # some keep points back
        budget: Any = dict(zip(OPTIONS, split, strict=True)) if i % 2 else split
        out.append({"remote": rng.random() < 0.4, "budget": budget})
    return out


def points(answer: Any) -> list[int]:
    return [answer.get(o, 0) for o in OPTIONS] if isinstance(answer, dict) else list(answer)


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[tuple[Path, list[ServerProcess]]]:
    """The survey deployed, open for an hour (closed by the test once its
    respondents are done: tests/support/window.py), and its servers running."""
    opens = int(time.time()) // TP * TP
    closes = opens + LONG_WINDOW
    survey = tmp_path / "survey.toml"
    survey.write_text(
        f'[survey]\nname = "Priorities"\nepsilon = 4\nmin_batch_size = 10\n'
        f'time_precision = {TP}\nopens = "{format_time(opens)}"\n'
        f'closes = "{format_time(closes)}"\n' + QUESTIONS
    )
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    out = veil(
        "survey", "deploy", "--survey", survey, "--out", tmp_path / "dep",
        "--leader", leader, "--helper", helper, "--no-tls",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    dep = tmp_path / "dep"
    servers = [
        ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    try:
        for server in servers:
            server.start()
        yield dep, servers
    finally:
        for server in servers:
            server.stop()


def test_points_survey_end_to_end(
    deployed: tuple[Path, list[ServerProcess]], tmp_path: Path
) -> None:
    dep, servers = deployed
    client_dir, collector_dir = dep / "client", dep / "collector"
    answers = panel(40, seed=5)
    jsonl = tmp_path / "panel.jsonl"
    jsonl.write_text("".join(json.dumps(a) + "\n" for a in answers))
    done = veil("survey", "respond", "--survey-dir", client_dir, "--answers", jsonl)
    assert done.returncode == 0, done.stderr
    assert "sent 80 answers of 40 respondents" in done.stdout

    # A split over the total is refused before anything is sent, in its words.
    over = veil(
        "survey", "respond", "--survey-dir", client_dir,
        "--answer", "remote=yes", "--answer", "budget=training:70,tools:40",
    )  # fmt: skip
    assert over.returncode == 2
    assert "the points add up to 110, over the total of 100; take 10 off" in over.stderr
    assert "sent" not in over.stdout
    one = veil(
        "survey", "respond", "--survey-dir", client_dir,
        "--answer", "remote=no", "--answer", "budget=training:30, 4:70",
    )  # fmt: skip
    assert one.returncode == 0 and "sent 2 answers of 1 respondent" in one.stdout, one.stderr
    answers.append({"remote": False, "budget": {"training": 30, "hiring": 70}})

    # A client that proves 60 + 60 + 0 + 0 under a claimed sum of 100: every value's
    # bits in range, the sum a lie. Both aggregators refuse it and it is not counted.
    task = load_task(client_dir / "budget.toml", ClientTask)
    with Client(task) as client:
        field = client.vdaf.field
        bits = [b for v in (60, 60, 0, 0, 100) for b in encode_range_checked_int(field, v, 100)]
        t = client.report_time()
        assert client.upload_reports([encoded_report(client, bits, t)]).accepted == 1

    close_survey(dep, servers)
    results = tmp_path / "results"
    out = veil(
        "survey", "collect", "--survey-dir", collector_dir, "--out", results,
        "--confidence", CONFIDENCE,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for role in ("leader", "helper"):
        store = SqliteDatastore(dep / role / f"{role}.db")
        try:
            assert store.rejections(task.task_id) == {"vdaf_verify_error": 1}, role
        finally:
            store.close()

    n = len(answers)
    truth = {o: sum(points(a["budget"])[i] for a in answers) / n for i, o in enumerate(OPTIONS)}
    published = {q["question"]: q for q in json.loads((results / "results.json").read_text())}
    budget = published["budget"]
    assert (budget["kind"], budget["n"]) == ("points", n)  # the lie is not among them
    assert [r["label"] for r in budget["rows"]] == OPTIONS
    assert budget["intervals"].startswith("simultaneous")
    for row in budget["rows"]:
        assert row["possible"] == [0, 100]
        assert 0 <= row["ci_low"] <= row["estimate"] <= row["ci_high"] <= 100
        assert row["ci_low"] <= truth[row["label"]] <= row["ci_high"], (row, truth)
        assert row["raw_ci_low"] <= row["raw_estimate"] <= row["raw_ci_high"]
    assert sum(r["estimate"] for r in budget["rows"]) <= 100 + 1e-6
    lines = list(csv.DictReader(io.StringIO((results / "results.csv").read_text())))
    assert [r["label"] for r in lines if r["question"] == "budget"] == OPTIONS
    assert {r["kind"] for r in lines if r["question"] == "budget"} == {"points"}
    page = (results / "report.html").read_text()
    assert "Split 100 points across what we should improve" in page
    assert all(o in page for o in OPTIONS) and "mean points (0 to 100)" in page
    assert "Points question &#x27;budget&#x27;" in page or "Points question 'budget'" in page
    summary = out.stdout
    assert "budget" in summary and all(o in summary for o in OPTIONS), summary

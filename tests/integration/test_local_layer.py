"""The local randomized-response layer wired through survey files, task files, the
client's report preparation, the collector's estimates and `veil task new`
(the servers' side: tests/integration/test_local_rr.py)."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
import tomli_w

from veil.cli import main
from veil.client.prepare import randomize_measurements
from veil.collector import CollectionResult
from veil.collector.estimate import estimates
from veil.deploy import deploy_survey
from veil.dp import DPConfig, NoisePlan, local_channel, local_estimate
from veil.dp.accounting import Guarantee
from veil.dp.local import KaryResponse, MultiOptionResponse
from veil.local.demo import example_survey
from veil.render.text import format_local_costs
from veil.survey import DESCRIPTION_FILE, SurveyError, load_description, parse_survey
from veil.survey.budget import with_local_epsilon
from veil.survey.plan import local_costs
from veil.survey.results import question_result
from veil.survey.statement import survey_statement, task_statement
from veil.survey.tasks import task_specs
from veil.task import DpSpec, Task, TaskError, VdafSpec, load_task, new_task

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "survey.toml")

SURVEY = """
[survey]
name = "s"
epsilon = 1

[[question]]
id = "yes"
kind = "yes_no"
local_epsilon = 1.5

[[question]]
id = "tools"
kind = "multi_choice"
options = ["a", "b", "c", "d", "e"]
max_choices = 2
local_epsilon = "3"

[[question]]
id = "plain"
kind = "choice"
options = ["a", "b"]
"""


def test_survey_enables_it_per_question() -> None:
    survey = parse_survey(SURVEY)
    yes, tools, plain = survey.questions
    assert yes.local_epsilon == Fraction(3, 2)
    assert plain.local_epsilon is None
    # Randomized multi-choice vectors can have any weight: the proof admits them all.
    assert tools.vdaf_params["max_weight"] == 5
    specs = task_specs(survey)
    vdaf, dp, _ = specs["tools"]
    channel = dp.local(vdaf)
    assert isinstance(channel, MultiOptionResponse)
    assert channel.max_choices == 2 and channel.bit.epsilon == Fraction(3, 4)
    assert isinstance(specs["yes"][1].local(specs["yes"][0]), KaryResponse)
    assert specs["plain"][1].local(specs["plain"][0]) is None
    # The central budget is untouched by the local layer.
    assert sum((q.epsilon for q in survey.questions), Fraction(0)) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "must be > 0"),
        ("-1", "must be > 0"),
        ("21", "maximum 20"),
        ('"abc"', "must be a number"),
        ("true", "must be a number"),
        ('"nan"', "must be a number"),
        ("nan", "not finite"),
        ("[1]", "must be a number"),
    ],
)
def test_bad_local_epsilon_in_a_survey_names_the_line(value: str, message: str) -> None:
    text = SURVEY.replace("local_epsilon = 1.5", f"local_epsilon = {value}")
    with pytest.raises(SurveyError, match=rf"<string>:9: .*{message}"):
        parse_survey(text)


def _task(vdaf: VdafSpec, dp: DpSpec) -> Task:
    return new_task(vdaf, "127.0.0.1:1", "127.0.0.1:2", dp=dp, min_batch_size=1).client


def test_task_files_carry_it_and_refuse_what_does_not_fit() -> None:
    task = _task(VdafSpec("count"), DpSpec("geometric", epsilon="1", local_epsilon="2"))
    again = Task.from_dict(tomllib.loads(_toml(task)))
    assert again.dp.local_epsilon == "2"
    assert isinstance(again.dp.local(again.vdaf), KaryResponse)
    base = task.to_dict()
    hostile = [
        ({"local_epsilon": "abc"}, "not a number"),
        ({"local_epsilon": "0"}, "must be > 0"),
        ({"local_epsilon": "1", "local_max_choices": 1}, "multihot tasks only"),
        ({"local_max_choices": 2}, "needs local_epsilon"),
        ({"local_epsilon": "1", "local_max_choices": "x"}, "must be an integer"),
        ({"local_epsilon": [1]}, "must be a number"),
    ]
    for extra, message in hostile:
        d = {**base, "dp": {**base["dp"], **extra}}
        if "local_epsilon" not in extra:
            del d["dp"]["local_epsilon"]
        with pytest.raises(TaskError, match=message):
            Task.from_dict(d)
    multihot = VdafSpec("multihot", length=4, max_weight=2, chunk_length=2)
    with pytest.raises(TaskError, match="must equal its length"):
        _task(multihot, DpSpec("geometric", epsilon="1", local_epsilon="1"))


def _toml(task: Task) -> str:
    return tomli_w.dumps(task.to_dict())


def test_client_randomizes_and_names_a_bad_measurement() -> None:
    task = _task(
        VdafSpec("multihot", length=3, max_weight=3, chunk_length=2),
        DpSpec("geometric", epsilon="1", local_epsilon="1", local_max_choices=1),
    )
    out = randomize_measurements(task, [[True, False, False]] * 200)
    assert all(len(m) == 3 and all(isinstance(b, bool) for b in m) for m in out)
    assert any(sum(m) > 1 for m in out)  # randomized: weights beyond the answer's
    with pytest.raises(ValueError, match=r"report 1: .*at most 1"):
        randomize_measurements(task, [[True, False, False], [True, True, False]])
    plain = replace(task, dp=DpSpec("geometric", epsilon="1"))
    same = [[True, False, False]]
    assert randomize_measurements(plain, same) is same


def test_collector_estimates_go_through_the_local_de_biasing() -> None:
    task = _task(VdafSpec("count"), DpSpec("geometric", epsilon="1", local_epsilon="1"))
    est, spent = estimates(task, [70], 0.95, report_count=100)
    channel = local_channel("Prio3Count", {}, 1)
    plan = NoisePlan.for_task(DPConfig.geometric(1), "Prio3Count", {})
    assert est == local_estimate([70], 100, channel, plan, 0.05)
    assert spent == 1
    with pytest.raises(ValueError, match="report count"):
        estimates(task, [70], 0.95)


def test_task_new_local_epsilon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "task", "new", "--vdaf", "multihot", "--length", "4", "--max-weight", "2",
            "--chunk-length", "2", "--local-epsilon", "2", "--leader", "127.0.0.1:1",
            "--helper", "127.0.0.1:2", "--out", str(tmp_path), "--name", "t",
        ]
    )  # fmt: skip
    assert code == 0
    task = tomllib.loads((tmp_path / "t.client.toml").read_text())
    assert task["vdaf"]["max_weight"] == 4
    assert task["dp"]["local_epsilon"] == "2" and task["dp"]["local_max_choices"] == 2
    capsys.readouterr()
    bad = main(
        [
            "task", "new", "--vdaf", "count", "--local-epsilon", "zero",
            "--leader", "127.0.0.1:1", "--helper", "127.0.0.1:2", "--out", str(tmp_path),
            "--name", "u",
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert bad == 2 and err.startswith("veil task new: ") and "not a number" in err
    assert not (tmp_path / "u.client.toml").exists()


def test_simulate_states_the_error_cost_per_question() -> None:
    survey = with_local_epsilon(example_survey(), Fraction(2))
    costs = {c.question: c for c in local_costs(survey, 10_000)}
    assert set(costs) == {q.id for q in survey.questions}
    for c in costs.values():
        assert c.local_epsilon == 2
        assert c.with_local is not None and c.with_local > c.without > 0
    # yes_no at ε_L = 2: sqrt(n·p(1-p) + Var Z)/(p - q) with p = e²/(e²+1).
    p = math.exp(2) / (math.exp(2) + 1)
    var_z = costs["remote"].without ** 2
    expected = math.sqrt(10_000 * p * (1 - p) + var_z) / (2 * p - 1)
    assert costs["remote"].with_local == pytest.approx(expected, rel=1e-9)
    # Integer and vector results are means: the error is per respondent, in the
    # units the results table shows (a vector's was a per-element sum, 10,000
    # times the error of the means printed above it).
    assert costs["commute"].with_local < 180
    assert costs["ratings"].with_local is not None and costs["ratings"].with_local < 10
    assert costs["ratings"].without < 10
    table = format_local_costs(list(costs.values()), 10_000)
    assert "at 10,000 respondents" in table
    assert "remote" in table and "x" in table.splitlines()[3]
    plain = local_costs(example_survey(), 100)
    assert all(c.with_local is None for c in plain)


def test_simulate_refuses_a_bad_local_epsilon(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--survey", EXAMPLE, "--local-epsilon", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("veil simulate: ") and "local_epsilon must be > 0" in err
    assert len(err.strip().splitlines()) == 1


def test_the_example_survey_enables_it_from_the_file_alone() -> None:
    text = Path(EXAMPLE).read_text(encoding="utf-8")
    assert "# local_epsilon = 2" in text
    survey = parse_survey(text.replace("# local_epsilon = 2", "local_epsilon = 2"))
    remote = survey.question("remote")
    assert remote.local_epsilon == 2
    vdaf, dp, _ = task_specs(survey)["remote"]
    assert isinstance(dp.local(vdaf), KaryResponse)
    assert all(q.local_epsilon is None for q in survey.questions if q.id != "remote")


def test_demo_refuses_a_bad_local_epsilon(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--local-epsilon", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil demo: ") and len(err.strip().splitlines()) == 1


def test_deployed_survey_carries_it_to_every_party(tmp_path: Path) -> None:
    text = SURVEY.replace(
        'name = "s"', 'name = "s"\nopens = 2026-05-01T00:00:00Z\ncloses = 2026-05-08T00:00:00Z'
    )
    survey = parse_survey(text)
    dep = deploy_survey(survey, text, tmp_path / "out", "a.example:443", "b.example:443")
    described = load_description(dep.client_dir)
    local = [q.local_epsilon for q in survey.questions]
    assert [q.local_epsilon for q in described.survey.questions] == local
    for party in ("client/yes.toml", "leader/tasks/yes.toml", "collector/yes.toml"):
        assert load_task(dep.out / party).dp.local_epsilon == "3/2"
    assert load_task(dep.out / "client" / "tools.toml").dp.local_max_choices == 2
    doc = json.loads((dep.client_dir / DESCRIPTION_FILE).read_text())
    assert doc["questions"][0]["local_epsilon"] == "3/2"
    assert "local_epsilon" not in doc["questions"][2]
    doc["questions"][0]["local_epsilon"] = "lots"
    target = dep.client_dir / DESCRIPTION_FILE
    target.chmod(0o644)
    target.write_text(json.dumps(doc))
    with pytest.raises(SurveyError, match="local_epsilon"):
        load_description(dep.client_dir)


def test_privacy_statements_gain_against_everyone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    count = VdafSpec("count")
    stated = task_statement(DpSpec("geometric", epsilon="1", local_epsilon="3/2"), count)
    assert stated.against_everyone == Guarantee.pure(Fraction(3, 2))
    assert stated.against_collector == Guarantee.pure(Fraction(1))
    assert stated.to_json()["against_everyone"] == {"epsilon": "1.5", "delta": "0"}
    assert any("both aggregators together" in line and "1.5" in line for line in stated.lines())
    assert task_statement(DpSpec("geometric", epsilon="1"), count).against_everyone is None
    # No servers' noise: the local layer holds against the collector too.
    bare = task_statement(DpSpec("none", local_epsilon="2"), count)
    assert bare.against_collector == bare.against_everyone == Guarantee.pure(Fraction(2))
    # A survey: the sum over its questions when every one has a local layer.
    partial = survey_statement(parse_survey(SURVEY))
    assert partial.against_everyone is None
    assert any("yes (ε_L = 1.5), tools (ε_L = 3)" in note for note in partial.notes)
    full = parse_survey(
        SURVEY.replace('options = ["a", "b"]', 'options = ["a", "b"]\nlocal_epsilon = 1')
    )
    assert survey_statement(full).against_everyone == Guarantee.pure(Fraction(11, 2))
    code = main(
        [
            "task", "new", "--vdaf", "count", "--local-epsilon", "2", "--json",
            "--leader", "127.0.0.1:1", "--helper", "127.0.0.1:2", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["privacy"]["against_everyone"] == {"epsilon": "2", "delta": "0"}


def test_survey_results_name_the_local_layer() -> None:
    survey = parse_survey(SURVEY)
    result = CollectionResult(
        start=0,
        duration=3600,
        report_count=100,
        estimate=Fraction(60),
        lower=Fraction(40),
        upper=Fraction(80),
        confidence=0.95,
        intervals="per-coordinate",
        spent=Fraction(1, 3),
        unit="epsilon",
        against_collector=Guarantee.pure(Fraction(1, 3)),
        mechanism="geometric",
        noisy_aggregate=[70],
        seconds=0.0,
    )
    published = question_result(survey.question("yes"), result).to_json()
    assert published["local_epsilon"] == "1.5" and published["epsilon"] == "0.333334"
    plain = question_result(replace(survey.question("yes"), local_epsilon=None), result)
    assert "local_epsilon" not in plain.to_json()

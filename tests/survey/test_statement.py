"""Privacy statements of tasks and surveys, and what the task files carry (issue 14)."""

from __future__ import annotations

import json
import time
from fractions import Fraction
from pathlib import Path

import grpc
import pytest

from veil.aggregator.store.ledger import sqlite_ledger
from veil.cli import main
from veil.collector import CollectionError, Collector
from veil.dp.accounting import zcdp_epsilon, zcdp_rho
from veil.hpke import ROLE_HELPER, agg_share_info, seal
from veil.settings import SettingsError
from veil.survey import parse_survey
from veil.survey.statement import privacy_statement, survey_statement, task_statement
from veil.survey.tasks import task_specs
from veil.task import DpSpec, HelperTask, TaskError, VdafSpec, load_task, new_task

COUNT = VdafSpec("count")
MICRO = Fraction(1, 10**6)


def test_independent_task_states_the_same_guarantee_twice() -> None:
    statement = task_statement(DpSpec("geometric", epsilon="1"), COUNT)
    data = statement.to_json()
    assert data["unit"] == "one report"
    assert data["neighbouring"] == "replace_one"
    assert data["against_collector"] == {"epsilon": "1", "delta": "0"}
    assert data["against_collector_and_one_aggregator"] == {"epsilon": "1", "delta": "0"}


def test_split_mode_needs_an_explicit_opt_in() -> None:
    with pytest.raises(TaskError, match="split_opt_in"):
        DpSpec("geometric", epsilon="1", mode="split").config()
    with pytest.raises(TaskError, match="split_opt_in applies"):
        DpSpec("geometric", epsilon="1", split_opt_in=True).config()
    with pytest.raises(SettingsError, match=r"split_opt_in. in \[dp\] must be true or false"):
        DpSpec.from_dict({"mechanism": "geometric", "epsilon": "1", "split_opt_in": "yes"})


@pytest.mark.parametrize(
    ("vdaf", "epsilon", "weaker"),
    [
        (VdafSpec("count"), "1", 1.675),
        (VdafSpec("count"), "0.1", 0.606),
        (VdafSpec("sum", max_measurement=180), "0.5", 2.15),
        (VdafSpec("sumvec", length=3, max_measurement=10, chunk_length=1), "0.25", 2.91),
    ],
)
def test_split_mode_states_and_charges_the_weaker_guarantee(
    vdaf: VdafSpec, epsilon: str, weaker: float
) -> None:
    dp = DpSpec("geometric", epsilon=epsilon, mode="split", split_opt_in=True)
    charge = dp.charge(vdaf)
    assert charge is not None and float(charge) == pytest.approx(weaker, abs=0.006)
    statement = task_statement(dp, vdaf).to_json()
    # The budget defaults to one collection's charge: the weaker guarantee is what
    # the task's whole budget gives against the collector with one aggregator ...
    assert float(statement["against_collector_and_one_aggregator"]["epsilon"]) == float(charge)
    # ... and against the collector alone it is the configured ε per collection.
    assert Fraction(statement["against_collector"]["epsilon"]) == Fraction(epsilon)


def test_split_mode_budget_scales_both_guarantees() -> None:
    dp = DpSpec("geometric", epsilon="1", mode="split", split_opt_in=True, budget="3.35")
    data = task_statement(dp, COUNT).to_json()
    assert data["against_collector_and_one_aggregator"]["epsilon"] == "3.35"
    assert float(data["against_collector"]["epsilon"]) == pytest.approx(2.0, abs=0.01)


def test_split_mode_without_meaning_is_refused() -> None:
    # SumVec(100, 255) at ε = 2 would give ε ≈ 105 against one aggregator.
    vdaf = VdafSpec("sumvec", length=100, max_measurement=255, chunk_length=10)
    dp = DpSpec("geometric", epsilon="2", mode="split", split_opt_in=True)
    with pytest.raises(TaskError, match="independent mode"):
        dp.plan(vdaf)


def test_gaussian_task_shows_rho_and_its_epsilon_delta() -> None:
    dp = DpSpec("gaussian", rho="0.5", delta="1e-9")
    data = task_statement(dp, COUNT).to_json()
    g = data["against_collector"]
    assert g["rho"] == "0.5" and g["delta"] == "0.000000001"
    assert Fraction(g["epsilon"]) == zcdp_epsilon(Fraction(1, 2), Fraction(1, 10**9))
    assert data["against_collector_and_one_aggregator"] == g
    words = task_statement(dp, COUNT).text()
    assert "ρ = 0.5 zCDP, which implies (ε = " in words


def test_delta_belongs_to_the_gaussian_mechanism() -> None:
    with pytest.raises(TaskError, match="delta belongs"):
        DpSpec("geometric", epsilon="1", delta="1e-6").config()
    with pytest.raises(TaskError, match="delta must be in"):
        DpSpec("gaussian", rho="1", delta="0.5").config()


def test_none_states_no_privacy() -> None:
    statement = task_statement(DpSpec("none"), COUNT)
    assert statement.to_json()["against_collector"] is None
    assert "No differential privacy" in statement.text()


def test_gaussian_survey_tasks_carry_rho_never_epsilon_as_rho() -> None:
    # The defect: demo.task_specs passed the survey's epsilon through as rho.
    survey = parse_survey(
        '[survey]\nepsilon = 2\ndelta = 1e-6\nmechanism = "gaussian"\n'
        '[[question]]\nid = "a"\nkind = "yes_no"\n'
    )
    rho = zcdp_rho(Fraction(2), MICRO)
    ((vdaf, dp, _),) = task_specs(survey).values()
    assert dp.epsilon is None and Fraction(dp.rho or "0") == rho
    assert dp.survey_unit == "rho" and Fraction(dp.survey_budget or "0") == rho
    # The whole survey is (ε <= 2, δ = 1e-6)-DP.
    data = survey_statement(survey).to_json()
    assert float(data["against_collector"]["epsilon"]) <= 2.0
    assert data["against_collector"]["rho"] == str(float(rho)).rstrip("0")
    task_data = task_statement(dp, vdaf).to_json()
    assert float(task_data["against_collector"]["epsilon"]) <= 2.0


def test_mixed_survey_statement_is_in_rho() -> None:
    survey = parse_survey(
        '[survey]\nrho = 1\n[[question]]\nid = "a"\nkind = "yes_no"\nmechanism = "gaussian"\n'
        '[[question]]\nid = "b"\nkind = "yes_no"\n'
    )
    statement = privacy_statement(survey)
    assert statement.against_collector.rho == 1
    assert any("composed under zCDP" in line for line in statement.lines())
    specs = task_specs(survey)
    assert specs["b"][1].mechanism == "geometric" and specs["b"][1].survey_unit == "rho"


# ------------------------------------------------------------------ veil task new


def _task_new(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "task", "new", "--vdaf", "count", "--leader", "127.0.0.1:1",
        "--helper", "127.0.0.1:2", "--out", str(tmp_path), *extra,
    ]  # fmt: skip


def test_task_new_json_prints_files_and_privacy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_task_new(tmp_path, "--mode", "split", "--split-opt-in", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"task_id", "files", "privacy"}
    assert set(data["files"]) == {"leader", "helper", "collector", "client"}
    assert all(Path(p).exists() for p in data["files"].values())
    privacy = data["privacy"]
    assert privacy["against_collector"] == {"epsilon": "1", "delta": "0"}
    assert privacy["against_collector_and_one_aggregator"]["epsilon"].startswith("1.67")
    # What the files say gives the same statement.
    leader = load_task(Path(data["files"]["leader"]))
    assert privacy_statement(leader).to_json() == privacy


def test_task_new_gaussian_solves_rho_into_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _task_new(tmp_path, "--mechanism", "gaussian", "--epsilon", "1", "--delta", "1e-6")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ρ = 0.0243559 zCDP, which implies (ε = 1" in out
    client = load_task(tmp_path / "task.client.toml")
    assert client.dp.epsilon is None and Fraction(client.dp.rho or 0) == zcdp_rho(1, MICRO)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode", "split"], "split_opt_in"),
        (["--mechanism", "gaussian", "--epsilon", "1"], "give --rho, or --epsilon with --delta"),
        (["--mechanism", "gaussian", "--epsilon", "1", "--delta", "x"], "--delta must be a"),
        (["--mechanism", "gaussian", "--epsilon", "1", "--delta", "0.5"], "--delta must be in"),
        (["--mechanism", "gaussian", "--rho", "1", "--epsilon", "1"], "not both"),
        (["--rho", "1"], "belong to the gaussian mechanism"),
        (["--mechanism", "gaussian", "--epsilon", "nan", "--delta", "1e-6"], "finite"),
    ],
)
def test_task_new_refuses_bad_privacy_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(_task_new(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil task new: ") and message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing written


# ------------------------------------------------- DP parameters in the HPKE context


def test_dp_binding_is_canonical_and_covers_every_noise_parameter() -> None:
    base = DpSpec("geometric", epsilon="0.5")
    assert base.binding(COUNT) == DpSpec("geometric", epsilon="1/2").binding(COUNT)
    assert base.binding(COUNT) == DpSpec("geometric", epsilon="0.50").binding(COUNT)
    variants = [
        DpSpec("geometric", epsilon="0.6"),
        DpSpec("geometric", epsilon="0.5", mode="split", split_opt_in=True),
        DpSpec("laplace", epsilon="0.5"),
        DpSpec("gaussian", rho="0.5"),
        DpSpec("geometric", epsilon="0.5", local_epsilon="2"),
    ]
    bindings = {v.binding(COUNT) for v in variants} | {base.binding(COUNT)}
    assert len(bindings) == len(variants) + 1
    # The sensitivity (from the VDAF) is bound too.
    assert base.binding(VdafSpec("sum", max_measurement=10)) != base.binding(
        VdafSpec("sum", max_measurement=11)
    )
    # δ only says how ρ is stated: it does not change the noise.
    assert DpSpec("gaussian", rho="0.5", delta="1e-9").binding(COUNT) == DpSpec(
        "gaussian", rho="0.5"
    ).binding(COUNT)


def test_a_share_sealed_under_other_dp_parameters_does_not_open(tmp_path: Path) -> None:
    # Issue 14 item 2: an aggregator whose [dp] differs from the collector's (here,
    # split mode at the helper, independent at the collector) must not yield
    # estimates with wrong intervals: its share fails to open.
    files = new_task(
        COUNT, "127.0.0.1:1", "127.0.0.1:2", dp=DpSpec("geometric", epsilon="1"),
        min_batch_size=1,
    )  # fmt: skip
    collector_task = files.collector
    vdaf = COUNT.instantiate()
    share = vdaf.encode_agg_share([7])
    assert collector_task.collector_hpke_config is not None

    def sealed(dp: DpSpec) -> object:
        info = agg_share_info(
            ROLE_HELPER, collector_task.task_id, 0, 3600, 5, dp_params=dp.binding(COUNT)
        )
        ct = seal(collector_task.collector_hpke_config, info, share)

        class Pb:
            config_id, enc, payload = ct.config_id, ct.enc, ct.payload

        return Pb

    with Collector(collector_task) as collector:
        assert collector._open(ROLE_HELPER, sealed(collector_task.dp), 0, 3600, 5) == [7]
        other = DpSpec("geometric", epsilon="1", mode="split", split_opt_in=True)
        with pytest.raises(CollectionError, match="same \\[dp\\] table") as e:
            collector._open(ROLE_HELPER, sealed(other), 0, 3600, 5)
        assert e.value.code == grpc.StatusCode.DATA_LOSS


def test_task_new_neighbouring_add_remove(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["task", "new", "--vdaf", "histogram", "--length", "3", "--chunk-length", "1",
            "--leader", "127.0.0.1:1", "--helper", "127.0.0.1:2", "--out", str(tmp_path),
            "--neighbouring", "add_remove", "--json"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["privacy"]["neighbouring"] == "add_remove"
    leader = load_task(Path(data["files"]["leader"]))
    assert (
        leader.dp.neighbouring == "add_remove" and leader.dp.plan(leader.vdaf).sensitivity.l1 == 1
    )


def test_status_shows_a_rho_budget_with_the_epsilon_it_implies(tmp_path: Path) -> None:
    # What `veil status` gathers and prints for a gaussian task (a ρ budget)
    # and for a pure one (ε), on the helper's database and ledger.
    from veil.aggregator.run.config import ServerConfig
    from veil.aggregator.status import gather, render_text
    from veil.aggregator.store.sqlite import SqliteDatastore
    from veil.dp import BudgetUnit

    def helper_task(dp: DpSpec) -> HelperTask:
        return new_task(COUNT, "127.0.0.1:1", "127.0.0.1:2", dp=dp, min_batch_size=1).helper

    gaussian = helper_task(DpSpec("gaussian", rho="1/2"))
    pure = helper_task(DpSpec("geometric", epsilon="1"))
    db = tmp_path / "helper.db"
    ledger = sqlite_ledger(db)
    ledger.add_task(gaussian.id_text, "0.5", BudgetUnit.RHO)
    ledger.spend(gaussian.id_text, "0.25")
    ledger.add_task(pure.id_text, "1")
    store = SqliteDatastore(db)
    try:
        status = gather("helper", ServerConfig("127.0.0.1:1", db, [gaussian, pure]), store, ledger)
    finally:
        store.close()
    budget, plain = (task["budget"] for task in status["tasks"])
    assert budget["implies"]["total"]["rho"] == "0.5"
    assert float(budget["implies"]["total"]["epsilon"]) == pytest.approx(5.2215, abs=1e-3)
    assert budget["implies"]["spent"]["rho"] == "0.25"
    assert "ρ 1/2 implies (ε = 5.22" in render_text(status)
    assert "implies" not in plain


def test_a_gaussian_task_file_may_state_epsilon_and_delta() -> None:
    dp = DpSpec.from_dict({"mechanism": "gaussian", "epsilon": "1", "delta": "1e-6"})
    assert dp.config().rho == zcdp_rho(Fraction(1), MICRO)
    g = task_statement(dp, COUNT).against_collector
    assert g.rho == zcdp_rho(Fraction(1), MICRO) and g.epsilon is not None and g.epsilon <= 1
    with pytest.raises(SettingsError, match="not epsilon alone"):
        DpSpec.from_dict({"mechanism": "gaussian", "epsilon": "1"})
    with pytest.raises(SettingsError, match="not both"):
        DpSpec.from_dict({"mechanism": "gaussian", "epsilon": "1", "rho": "1", "delta": "1e-6"})


def test_aggregator_charges_split_mode_the_weaker_epsilon(tmp_path: Path) -> None:
    # What an aggregator's ledger charges for one collection in split mode: the ε
    # against the collector with one aggregator (1.675 for a count at ε = 1).
    from veil.aggregator.errors import BudgetExhausted, NoiseUnavailable
    from veil.aggregator.privacy import PrivacyEngine

    dp = DpSpec("geometric", epsilon="1", mode="split", split_opt_in=True, budget="2")
    files = new_task(COUNT, "127.0.0.1:1", "127.0.0.1:2", dp=dp, min_batch_size=1)
    engine = PrivacyEngine(str(tmp_path / "ledger.db"), [files.helper])
    engine.check(files.helper, 0, 3600)
    deadline = time.monotonic() + 30
    while True:  # the pool draws the first noise vector in the background
        try:
            _, spent = engine.release(files.helper, COUNT.instantiate(), b"c" * 16, 0, 3600, [0])
            break
        except NoiseUnavailable:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert 1.67 < spent < 1.68
    with pytest.raises(BudgetExhausted, match=r"spends ε 1\.675\d* but only ε 0\.32"):
        engine.check(files.helper, 0, 3600)


def test_the_structure_says_what_each_guarantee_covers() -> None:
    """Issue 25: under add_remove the collector with one aggregator is protected
    on values only (an aggregator sees each report arrive): said in the JSON too."""
    from veil.render.html import privacy_lines

    replace = task_statement(DpSpec("geometric", epsilon="1"), COUNT).to_json()
    assert replace["covers"] == {
        "against_collector": ["values"],
        "against_collector_and_one_aggregator": ["values"],
    }
    assert replace["released_exactly"] == ["report_count", "batch_floor_reached"]
    add_remove = task_statement(
        DpSpec("geometric", epsilon="1", neighbouring="add_remove"), COUNT
    ).to_json()
    assert add_remove["covers"] == {
        "against_collector": ["values", "participation"],
        "against_collector_and_one_aggregator": ["values"],
    }
    assert add_remove["released_exactly"] == ["batch_floor_reached"]
    assert add_remove["each_aggregator_sees"] == ["report_arrivals", "report_count"]
    none = task_statement(DpSpec("none"), COUNT).to_json()
    assert none["covers"]["against_collector"] == []
    # The floor is public, on report.html as in the statement.
    survey = parse_survey('[survey]\nepsilon = 1\n[[question]]\nid = "a"\nkind = "yes_no"\n')
    assert any("The batch floor is public" in line for line in privacy_lines(survey))

"""One VDAF registry: task files, the CLI, survey questions, measurement
parsing and the DP sensitivities all derive from veil.vdaf.registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from veil.cli import build_parser
from veil.cli.respondent import parse_measurement
from veil.dp.estimates import feasible_range
from veil.dp.sensitivities import VDAF_TYPES as DP_NAMES
from veil.dp.sensitivities import sensitivity
from veil.survey import KINDS as QUESTION_KINDS
from veil.survey import Question
from veil.task import DpSpec, TaskError, VdafSpec, load_task, new_task, write_toml
from veil.vdaf import Poplar1, registry

EXAMPLES = {
    "count": ({}, "yes", 1),
    "sum": ({"max_measurement": 9}, "7", 7),
    "sumvec": ({"length": 3, "max_measurement": 5, "chunk_length": 2}, "1,2,3", [1, 2, 3]),
    "histogram": ({"length": 4, "chunk_length": 2}, "2", 2),
    "multihot": (
        {"length": 3, "max_weight": 2, "chunk_length": 2},
        "1,0,1",
        [True, False, True],
    ),
    "l1boundsum": (
        {"length": 3, "max_value": 10, "chunk_length": 2},
        "1,0,9",
        [1, 0, 9],
    ),
}


def test_every_kind_is_covered_here() -> None:
    assert set(EXAMPLES) == set(registry.NAMES)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_kind_builds_parses_and_has_dp_bounds(name: str) -> None:
    params, text, measurement = EXAMPLES[name]
    kind = registry.kind(name)
    vdaf = kind.make(params)
    spec = VdafSpec(name, **params)
    assert spec.params == params and spec.to_dict() == {"type": name, **params}
    assert type(spec.instantiate()) is type(vdaf)
    assert parse_measurement(spec, f" {text} ") == measurement
    vdaf.shard(b"ctx", measurement, bytes(16), bytes(vdaf.RAND_SIZE))
    # veil.dp derives a sensitivity and a feasible range for the draft's name.
    assert kind.prio3 in DP_NAMES
    dp_params = {k: v for k, v in params.items() if k != "chunk_length"}
    assert sensitivity(kind.prio3, dp_params).l1 >= 1
    assert feasible_range(kind.prio3, dp_params, 10)[1] >= 10
    with pytest.raises(ValueError, match=f"not a valid {name} measurement"):
        parse_measurement(spec, "x")


def test_parameters_of_another_kind_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="a sum VDAF takes max_measurement, not length"):
        VdafSpec("sum", max_measurement=5, length=3)
    with pytest.raises(ValueError, match="missing max_measurement"):
        registry.kind("sum").make({})
    with pytest.raises(KeyError, match="expected one of count, sum"):
        registry.kind("sums")
    files = new_task(
        VdafSpec("sum", max_measurement=5), "a:1", "b:2", min_batch_size=2, dp=DpSpec("none")
    )
    path = tmp_path / "t.toml"
    write_toml(path, files.client.to_dict(), secret=False)
    text = path.read_text()
    path.write_text(text.replace("max_measurement = 5", "max_measurement = 5\nmax_weight = 2"))
    line = next(i + 1 for i, ln in enumerate(path.read_text().splitlines()) if "max_weight" in ln)
    with pytest.raises(
        TaskError, match=rf"t.toml:{line}: unknown setting 'max_weight' in \[vdaf\]"
    ):
        load_task(path)
    path.write_text(text.replace('type = "sum"', 'type = "summ"'))
    with pytest.raises(TaskError, match="unknown VDAF type 'summ'"):
        load_task(path)


def test_the_cli_and_survey_questions_use_the_registry() -> None:
    parser = build_parser()
    task_new = parser.parse_args(
        ["task", "new", "--vdaf", "count", "--leader", "a", "--helper", "b"]
    )
    assert task_new.vdaf == "count"
    with pytest.raises(SystemExit):
        parser.parse_args(["task", "new", "--vdaf", "bogus", "--leader", "a", "--helper", "b"])
    from fractions import Fraction

    shapes = {
        "yes_no": {},
        "integer": {"max": 10},
        "choice": {"options": ("a", "b", "c")},
        "multi_choice": {"options": ("a", "b", "c"), "max_choices": 2},
        "vector": {"length": 3, "max": 4},
        "points": {"options": ("a", "b", "c"), "total": 10},
        "text": {"max_bytes": 4},
    }
    for kind in QUESTION_KINDS:
        q = Question(id="q", text="q", kind=kind, epsilon=Fraction(1), **shapes[kind])
        if q.vdaf_type in registry.PREFIX_KINDS:
            # A text question: Poplar1 over its answers' bits.
            poplar1 = q.vdaf()
            assert isinstance(poplar1, Poplar1) and poplar1.BITS == 32
            continue
        assert q.vdaf_type in registry.NAMES
        assert type(q.vdaf()) is type(VdafSpec(q.vdaf_type, **q.vdaf_params).instantiate())


def test_poplar1_is_named_with_its_bits() -> None:
    kind = registry.PREFIX_KINDS["poplar1"]
    assert kind.draft == "Poplar1" and kind.params == ("bits",)
    vdaf = kind.make({"bits": 128})
    assert vdaf.BITS == 128 and vdaf.ID == 6
    with pytest.raises(ValueError, match="missing bits"):
        kind.make({})
    with pytest.raises(ValueError, match="not length"):
        kind.make({"bits": 8, "length": 3})
    # Not (yet) a type task files accept: they carry no aggregation parameter.
    assert "poplar1" not in registry.NAMES

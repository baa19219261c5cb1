"""Text questions in the survey model: the normalisation (shared with the
JavaScript client through tests/fixtures/text_answers.json), the survey file's
settings and their errors, the plan, the statement and the mapping to tasks."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from veil.dp.heavy_hitters import detection_floor, release_probability
from veil.observations import load_inventory, unclassified
from veil.render.text import format_plan
from veil.survey import AnswerError, SurveyError, parse_survey
from veil.survey.plan import TEXT_FIELDS, plan_json, plan_survey
from veil.survey.statement import survey_statement
from veil.survey.tasks import task_specs
from veil.survey.text import TextAnswerError, answer_from_bytes, encode_text_answer

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "text_answers.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]

HEAD = '[survey]\nname = "t"\nepsilon = 4\nexpected_respondents = 10000\n'
# Line 5 is blank; the question table starts on line 6.
TEXT = '[[question]]\nid = "tool"\nkind = "text"\n'


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_normalisation_matches_the_shared_fixture(case: dict[str, object]) -> None:
    answer, max_bytes = case["answer"], case["max_bytes"]
    assert isinstance(max_bytes, int)
    sensitive = bool(case["case_sensitive"])
    if "error" in case:
        with pytest.raises(TextAnswerError) as info:
            encode_text_answer(answer, max_bytes, sensitive)
        assert info.value.code == case["error"]
        return
    encoded = encode_text_answer(answer, max_bytes, sensitive)
    assert encoded.text == case["normalized"]
    assert encoded.data.hex() == case["bytes"]
    assert "".join("1" if b else "0" for b in encoded.measurement) == case["bits"]
    assert answer_from_bytes(encoded.data) == encoded.text


def test_fixture_covers_every_refusal() -> None:
    assert {c.get("error") for c in CASES} >= {"empty", "nul", "invalid", "too_long"}
    with pytest.raises(TextAnswerError) as info:
        encode_text_answer(7, 16)
    assert info.value.code == "type"
    for bad in (0, 257, True, "16"):
        with pytest.raises(ValueError, match="max_bytes"):
            encode_text_answer("a", bad)  # type: ignore[arg-type]


def test_text_question_defaults_and_measurement() -> None:
    survey = parse_survey(HEAD + "\n" + TEXT, "s.toml")
    q = survey.question("tool")
    assert (q.kind, q.max_bytes, q.case_sensitive, q.threshold, q.min_share) == (
        "text",
        16,
        False,
        None,
        None,
    )
    assert (q.vdaf_type, q.vdaf_params) == ("poplar1", {"bits": 128})
    assert q.vdaf().BITS == 128
    bits = q.to_measurement("  VS Code ")
    assert bits == encode_text_answer("vs code", 16).measurement
    with pytest.raises(AnswerError, match=r"question 'tool': the answer is too long: 17 bytes"):
        q.to_measurement("x" * 17)
    with pytest.raises(AnswerError, match="empty"):
        q.to_measurement("   ")
    with pytest.raises(AnswerError, match="must be a string"):
        q.to_measurement(["a"])


def test_text_question_settings() -> None:
    body = TEXT + "max_bytes = 4\ncase_sensitive = true\nmin_share = 0.02\n"
    q = parse_survey(HEAD + "\n" + body, "s.toml").question("tool")
    assert (q.max_bytes, q.case_sensitive, q.min_share) == (4, True, Fraction(1, 50))
    assert q.to_measurement("Ab") == encode_text_answer("Ab", 4, True).measurement
    t = q.release_threshold(10_000)
    assert (t.value, t.source) == (200, "min_share")
    fixed = parse_survey(HEAD + "\n" + TEXT + "threshold = 30\n", "s.toml").question("tool")
    assert fixed.release_threshold(None).value == 30


@pytest.mark.parametrize(
    ("setting", "line", "message"),
    [
        ("max_bytes = 0", 9, r"`max_bytes` must be from 1 to 64, got 0"),
        ("max_bytes = 65", 9, r"from 1 to 64"),
        ('max_bytes = "16"', 9, r"whole number of bytes"),
        ("max_bytes = true", 9, r"whole number of bytes"),
        ("max_bytes = 1.5", 9, r"whole number of bytes"),
        ('case_sensitive = "yes"', 9, r"`case_sensitive` must be true or false"),
        ("threshold = 0", 9, r"`threshold` must be a whole number of respondents, at least 1"),
        ("threshold = 2.5", 9, r"`threshold` must be a whole number"),
        ("threshold = -3", 9, r"at least 1"),
        ("min_share = 0", 9, r"`min_share` must be a share of the respondents from 0 to 1"),
        ("min_share = 1.5", 9, r"from 0 to 1"),
        ('min_share = "lots"', 9, r"from 0 to 1"),
        ("threshold = 5\nmin_share = 0.1", 10, r"`threshold` or `min_share`, not both"),
        ("local_epsilon = 1", 9, r"takes no `local_epsilon`"),
        ('options = ["a", "b"]', 9, r"unknown setting 'options'.*text question"),
        ("max = 3", 9, r"unknown setting 'max'"),
        ("epsilon = 0.004", 9, r"text question 'tool': .*larger share or fewer max_bytes"),
    ],
)
def test_text_settings_errors_name_file_and_line(setting: str, line: int, message: str) -> None:
    with pytest.raises(SurveyError, match=message) as info:
        parse_survey(HEAD + "\n" + TEXT + setting + "\n", "s.toml")
    assert str(info.value).startswith(f"s.toml:{line}:"), str(info.value)


def test_add_remove_is_refused_for_a_text_question() -> None:
    head = HEAD.replace("epsilon = 4\n", 'epsilon = 4\nneighbouring = "add_remove"\n')
    with pytest.raises(SurveyError, match="add_remove") as info:
        parse_survey(head + "\n" + TEXT, "s.toml")
    assert str(info.value).startswith("s.toml:9:"), info.value


def test_min_share_needs_expected_respondents() -> None:
    head = '[survey]\nname = "t"\nepsilon = 4\n'
    with pytest.raises(SurveyError, match="expected_respondents") as info:
        parse_survey(head + "\n" + TEXT + "min_share = 0.05\n", "s.toml")
    assert str(info.value).startswith("s.toml:8:")


@pytest.mark.parametrize(
    "document",
    [
        TEXT + "max_bytes = 16\nmax_bytes = 8\n",  # a key twice: not TOML
        TEXT + "max_bytes = { a = 1 }\n",
        TEXT + "threshold = [1, 2]\n",
        TEXT + "min_share = nan\n",
        TEXT + "min_share = inf\n",
        TEXT + "case_sensitive = 1\n",
        '[[question]]\nid = "tool"\nkind = "Text"\n',
        TEXT + "max_bytes = 99999999999999999999\n",
    ],
)
def test_hostile_text_questions_are_refused(document: str) -> None:
    with pytest.raises(SurveyError, match=r"^s\.toml:(\d+:)? "):
        parse_survey(HEAD + "\n" + document, "s.toml")


def test_plan_shows_threshold_release_probability_and_detection_floor() -> None:
    survey = parse_survey(
        HEAD + "\n" + TEXT + '\n[[question]]\nid = "ok"\nkind = "yes_no"\n', "s.toml"
    )
    (text, yes_no) = plan_survey(survey, 10_000)
    q = survey.question("tool")
    plan = q.heavy_hitters()
    threshold = q.release_threshold(10_000).value
    floor = detection_floor(plan, threshold, 10_000)
    assert (text.threshold, text.detection_floor) == (threshold, floor.count)
    assert text.release_probability == release_probability(plan, threshold)
    assert text.needed == -(-floor.count * 10 // 1)  # floor ≤ 10% of n from n = 10·floor
    assert yes_no.detection_floor is None
    out = format_plan(survey, [text, yes_no])
    assert f"at least {floor.count:,} respondents" in out
    assert f"reaches {threshold:,}" in out
    rows = json.loads(plan_json(survey, [text, yes_no]))["questions"]
    assert rows[0]["detection_floor"] == floor.count
    assert "detection_floor" not in rows[1]


def test_statement_says_what_a_text_question_spends_and_releases() -> None:
    survey = parse_survey(HEAD + "\n" + TEXT + "max_bytes = 8\nthreshold = 40\n", "s.toml")
    q = survey.question("tool")
    notes = " ".join(survey_statement(survey).notes)
    assert "16 collections" not in notes
    assert "8 collections of the same batch, one per byte" in notes
    assert "ε = 0.5 each" in notes
    assert "L1 = 2" in notes
    assert "reaches 40 (the survey's `threshold`)" in notes
    p = release_probability(q.heavy_hitters(), 40)
    assert f"at most {p:.2g}" in notes


def test_a_text_question_is_a_poplar1_task_with_the_questions_budget() -> None:
    survey = parse_survey(HEAD + "\n" + TEXT + "max_bytes = 8\n", "s.toml")
    vdaf, dp, settings = task_specs(survey)["tool"]
    assert (vdaf.type, vdaf.bits) == ("poplar1", 64)
    q = survey.question("tool")
    # What the aggregators spend per level is what the statement and plan state.
    assert dp.text_plan(vdaf).level_plan == q.heavy_hitters().level_plan
    assert dp.text_plan(vdaf).charge == q.heavy_hitters().charge == q.epsilon
    assert settings == {"min_batch_size": survey.min_batch_size}


def test_the_plans_text_fields_are_in_the_observation_inventory() -> None:
    survey = parse_survey(HEAD + "\n" + TEXT, "s.toml")
    plan = json.loads(plan_json(survey, plan_survey(survey, 10_000)))
    fields = [f"json:survey-plan.questions[].{key}" for key in plan["questions"][0]]
    text_only = [f for f in fields if f.rsplit(".", 1)[1] in (*TEXT_FIELDS, "finds_nothing")]
    assert len(text_only) == len(TEXT_FIELDS) + 1
    assert unclassified(load_inventory(), "collector", text_only) == []

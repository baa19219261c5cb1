"""Simulated respondents answer validly and the truth matches the answers."""

from __future__ import annotations

import random
from pathlib import Path

from veil.local.simulate import simulate_respondents, truth
from veil.survey import load_survey

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "survey.toml"


def test_answers_are_valid_measurements_and_truth_adds_up() -> None:
    survey = load_survey(EXAMPLE)
    answers = simulate_respondents(survey, 300, random.Random(5))
    for q in survey.questions:
        vdaf = q.vdaf()
        for a in answers[:20]:
            # shard validates the measurement: simulated answers must pass it
            vdaf.shard(b"t", q.to_measurement(a[q.id]), bytes(16), bytes(vdaf.RAND_SIZE))
    remote = survey.question("remote")
    assert truth(remote, answers) == sum(a["remote"] for a in answers)
    team = survey.question("team")
    counts = truth(team, answers)
    assert isinstance(counts, list) and sum(counts) == 300
    ratings = survey.question("ratings")
    sums = truth(ratings, answers)
    assert sums == [sum(a["ratings"][i] for a in answers) for i in range(3)]

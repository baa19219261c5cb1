"""A text question collected on this machine by simulation: `veil demo`, `veil simulate`.

The descent is the collector's own (`veil.collector.text.descend`), with the same
candidates, threshold and budget per level. What stands in for the two aggregators
is `simulated_query`: each candidate's exact prefix count among the simulated
answers, plus one draw of each aggregator's noise for that level
(`NoisePlan.total_noise`: the exact samplers of `veil.dp`). Poplar1's aggregate is
exactly the prefix counts (its tests hold it to the draft's vectors), so the counts
released have the distribution a collection through the servers gives; what this
does not exercise is the protocol (sharding, the two verification rounds, the
ledgers), which `veil survey collect` runs against real aggregators, at a cost
in proportion to reports times prefixes per level that the demo does not wait for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from veil.collector.text import LevelQuery, TextProgress, descend
from veil.dp.accounting import Guarantee
from veil.dp.distributions import RandomSource
from veil.dp.heavy_hitters import HeavyHittersPlan
from veil.survey import Question, Survey
from veil.survey.results import QuestionResult, text_result
from veil.survey.text import MAX_PREFIXES, encode_text_answer

__all__ = ["collect_simulated", "simulated_query"]


def simulated_query(
    answers: Sequence[bytes], plan: HeavyHittersPlan, rng: RandomSource | None = None
) -> LevelQuery:
    """A level's noisy prefix counts over `answers` (padded bytes), noised as both
    aggregators noise them (`plan`'s level noise: one draw per aggregator; from
    `rng`, default the system's, as the servers draw it)."""
    noise = plan.level_plan.total_noise()

    def query(level: int, prefixes: Sequence[bytes], _job: bytes) -> list[int]:
        counts = Counter(a[: level + 1] for a in answers)
        total = [counts.get(p, 0) for p in prefixes]
        for part in noise.parts:
            draws = part.sample_array(len(prefixes), rng)
            total = [c + int(z) for c, z in zip(total, draws, strict=True)]
        return total

    return query


def collect_simulated(
    survey: Survey,
    q: Question,
    answers: Sequence[str],
    say: Callable[[str], None] = lambda _: None,
    rng: RandomSource | None = None,
) -> QuestionResult:
    """Find the answers of text question `q` among `answers` (as typed) by the
    descent, and publish them as `veil survey collect` does, with each row's truth."""
    plan = q.heavy_hitters()
    threshold = q.release_threshold(survey.expected_respondents or len(answers))
    encoded = [encode_text_answer(a, q.max_bytes, q.case_sensitive) for a in answers]
    found = descend(
        TextProgress(q.max_bytes),
        threshold.value,
        MAX_PREFIXES,
        simulated_query([e.data for e in encoded], plan, rng),
        save=lambda _: None,
        say=say,
    ).survivors
    guarantee, _ = plan.guarantees()
    if guarantee.rho is not None and survey.delta is not None:
        guarantee = Guarantee.zcdp(guarantee.rho, survey.delta)
    result = text_result(q, found, len(answers), threshold, guarantee)
    truth = Counter(e.text for e in encoded)
    rows = tuple(replace(row, truth=truth.get(row.label, 0)) for row in result.rows)
    return replace(result, rows=rows)


def text_summary(result: QuestionResult, answers: Sequence[str], share: float = 0.02) -> str:
    """One line on a simulated text question: the answers found, whether every
    answer given by at least `share` of the respondents is among them, whether any
    answer given once was released (with the stated probability), and how many
    intervals cover the truth."""
    assert result.threshold is not None
    q = result.question
    counts = Counter(encode_text_answer(a, q.max_bytes, q.case_sensitive).text for a in answers)
    found = {row.label for row in result.rows}
    common = [a for a, c in counts.items() if c >= share * len(answers)]
    missed = [a for a in common if a not in found]
    once = [a for a, c in counts.items() if c == 1]
    released = [a for a in found if counts.get(a) == 1]
    covered = sum(1 for row in result.rows if row.ci_low <= (row.truth or 0) <= row.ci_high)
    return (
        f"{len(result.rows)} answers found (noisy count at least {result.threshold.value});"
        f" given by at least {share:.0%}: {len(common)}, "
        + ("all found" if not missed else f"missed {', '.join(repr(a) for a in missed)}")
        + f"; given once: {len(once)}, released: {len(released)} (each at most"
        f" {result.threshold.release_probability:.2g} likely);"
        f" intervals covering the truth: {covered} of {len(result.rows)}"
    )

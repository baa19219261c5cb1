"""The collector's descent for a text question (veil.collector.text): candidates,
the threshold, the bound on prefixes per query, and resuming between levels."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.collector.text import TextProgress, candidates, descend, next_bytes, prefix_bits
from veil.survey.text import TextAnswerError, encode_text_answer


def exact_query(  # type: ignore[no-untyped-def]
    answers: Sequence[str],
    max_bytes: int,
    calls: list[tuple[int, bytes]],
    case_sensitive: bool = False,
):
    data = [encode_text_answer(a, max_bytes, case_sensitive).data for a in answers]

    def query(level: int, prefixes: Sequence[bytes], job: bytes) -> list[int]:
        calls.append((level, job))
        assert all(len(p) == level + 1 for p in prefixes)
        assert list(prefixes) == sorted(set(prefixes))  # distinct, in order
        counts = Counter(d[: level + 1] for d in data)
        return [counts.get(p, 0) for p in prefixes]

    return query


def test_next_bytes_follow_utf8_and_the_padding() -> None:
    assert len(next_bytes(b"a")) == 1 + 127 + 51  # zero, ASCII, lead bytes C2..F4
    assert next_bytes(b"ab\x00") == (0,)
    assert next_bytes("é".encode()[:1]) == tuple(range(0x80, 0xC0))
    assert len(next_bytes("é".encode())) == 179
    assert next_bytes("코".encode()[:2]) == tuple(range(0x80, 0xC0))
    assert next_bytes("👍".encode()[:3]) == tuple(range(0x80, 0xC0))
    assert prefix_bits(b"\x80\x01") == (True,) + (False,) * 14 + (True,)


def test_next_bytes_follow_the_normalisation() -> None:
    # Lower-cased: no A..Z anywhere.
    assert len(next_bytes(b"a", lower_case=True)) == 179 - 26
    assert not set(range(0x41, 0x5B)) & set(next_bytes(b"ab", lower_case=True))
    assert 0x41 in next_bytes(b"ab")
    # Trimmed: no whitespace first, no padding right after whitespace.
    assert not {0, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20} & set(next_bytes(b""))
    assert len(next_bytes(b"")) == 179 - 7
    assert 0 not in next_bytes(b"a ") and 0 not in next_bytes("a\u3000".encode())
    assert 0x20 in next_bytes(b"a ")
    assert 0xA0 not in next_bytes(b"\xc2") and 0xA0 in next_bytes(b"a\xc2")  # NBSP
    assert 0x80 not in next_bytes(b"\xe3\x80") and 0x80 in next_bytes(b"a\xe3\x80")
    # UTF-8's narrower second bytes: no overlong form, surrogate or code point
    # above U+10FFFF.
    assert next_bytes(b"a\xe0") == tuple(range(0xA0, 0xC0))
    assert next_bytes(b"a\xed") == tuple(range(0x80, 0xA0))
    assert next_bytes(b"a\xf0") == tuple(range(0x90, 0xC0))
    assert next_bytes(b"a\xf4") == tuple(range(0x80, 0x90))
    assert next_bytes(b"a\xf4\x80") == tuple(range(0x80, 0xC0))


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=12), st.booleans())
def test_every_answer_the_encoder_makes_is_reachable(answer: str, case_sensitive: bool) -> None:
    """Each byte of an encoded answer is among those next_bytes allows after
    the bytes before it: the descent never rules out an answer a client sends."""
    try:
        data = encode_text_answer(answer, 48, case_sensitive).data
    except TextAnswerError:
        return
    for k in range(len(data)):
        assert data[k] in next_bytes(data[:k], lower_case=not case_sensitive), (data, k)


def test_first_level_and_the_bound_on_prefixes() -> None:
    first, dropped = candidates([], 4096)
    assert (len(first), dropped, b"\x00" in first, b" " in first) == (172, 0, False, False)
    assert len(candidates([], 4096, lower_case=True)[0]) == 172 - 26
    # Three open survivors need 3 * 179 candidates; 400 fit two, highest first.
    names, dropped = candidates([(b"a", 10), (b"b", 30), (b"c", 20), (b"d\x00", 5)], 400)
    assert dropped == 1
    assert {p[:1] for p in names} == {b"b", b"c", b"d"}
    assert b"d\x00\x00" in names and len(names) == 2 * 179 + 1


def test_descent_finds_exactly_the_answers_at_the_threshold() -> None:
    answers = ["vim"] * 5 + ["vs code"] * 3 + ["café"] * 2 + ["코드"] * 2 + ["once", "vi"]
    calls: list[tuple[int, bytes]] = []
    saved: list[dict[str, object]] = []
    done = descend(
        TextProgress(8),
        2,
        4096,
        exact_query(answers, 8, calls),
        save=lambda p: saved.append(p.to_json()),
        lower_case=True,
    )
    found = {p.rstrip(b"\x00").decode(): c for p, c in done.survivors}
    assert found == {"vim": 5, "vs code": 3, "café": 2, "코드": 2}
    assert [level for level, _ in calls] == list(range(8))
    assert len({job for _, job in calls}) == 8  # a job per level
    assert done.finished and done.queried[0] == 146 and done.dropped == 0
    # Saved before each job (with its id) and after each level.
    assert len(saved) == 16 and saved[0]["job"] == calls[0][1].hex()


def test_whole_answers_go_straight_to_the_last_level() -> None:
    answers = ["vim"] * 3 + ["nano"] * 2 + ["Emacs"] * 2
    calls: list[tuple[int, bytes]] = []
    done = descend(TextProgress(16), 2, 4096, exact_query(answers, 16, calls, True), lambda _: None)
    # Bytes 1 to 6 (the sixth is padding for all three), then byte 16.
    assert [level for level, _ in calls] == [0, 1, 2, 3, 4, 5, 15]
    assert done.finished and done.done == 16 and done.queried[-1] == 3
    assert {p.rstrip(b"\x00"): c for p, c in done.survivors} == {
        b"vim": 3,
        b"nano": 2,
        b"Emacs": 2,
    }


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=6),
    st.booleans(),
)
def test_the_descent_finds_every_answer_at_the_threshold(
    answers: list[str], case_sensitive: bool
) -> None:
    """Exact counts and a threshold of 1: every answer a client can send is found,
    whatever the shortcuts the encoding allows."""
    given_: set[bytes] = set()
    for a in answers:
        try:
            given_.add(encode_text_answer(a, 12, case_sensitive).data)
        except TextAnswerError:
            continue
    counted = [a for a in answers if _encodes(a, case_sensitive)]
    if not counted:
        return
    done = descend(
        TextProgress(12),
        1,
        1 << 16,
        exact_query(counted, 12, [], case_sensitive),
        lambda _: None,
        lower_case=not case_sensitive,
    )
    assert {p for p, _ in done.survivors} == given_


def _encodes(answer: str, case_sensitive: bool) -> bool:
    try:
        encode_text_answer(answer, 12, case_sensitive)
    except TextAnswerError:
        return False
    return True


def test_a_stopped_run_resumes_the_level_under_way_with_its_job() -> None:
    answers = ["emacs"] * 4 + ["nano"] * 3
    saved: list[str] = []
    calls: list[tuple[int, bytes]] = []
    query = exact_query(answers, 6, calls)

    def failing(level: int, prefixes: Sequence[bytes], job: bytes) -> list[int]:
        if level == 3:
            raise ConnectionError("leader unreachable")
        return query(level, prefixes, job)

    with pytest.raises(ConnectionError):
        descend(
            TextProgress(6), 2, 4096, failing, save=lambda p: saved.append(json.dumps(p.to_json()))
        )
    progress = TextProgress.from_json(json.loads(saved[-1]))
    assert (progress.done, progress.job is not None) == (3, True)
    done = descend(progress, 2, 4096, query, save=lambda _: None)
    assert calls[-3][1] == bytes.fromhex(progress.job or "")  # level 3 again, same job
    assert sorted(p.rstrip(b"\x00") for p, _ in done.survivors) == [b"emacs", b"nano"]


def test_no_survivors_ends_the_descent() -> None:
    calls: list[tuple[int, bytes]] = []
    done = descend(TextProgress(16), 2, 4096, exact_query(["a", "b"], 16, calls), lambda _: None)
    assert done.finished and done.survivors == [] and len(calls) == 1


def test_a_query_answering_the_wrong_number_of_counts_is_refused() -> None:
    with pytest.raises(ValueError, match="counts for 172 candidates"):
        descend(TextProgress(2), 2, 4096, lambda *_: [1, 2], lambda _: None)


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {
            "levels": 2,
            "done": 1,
            "survivors": [["zz", 1]],
            "job": None,
            "dropped": 0,
            "queried": [],
        },
        {
            "levels": 2,
            "done": 1,
            "survivors": [["6162", 1]],
            "job": None,
            "dropped": 0,
            "queried": [],
        },
        {"levels": 2, "done": 3, "survivors": [], "job": None, "dropped": 0, "queried": []},
        {"levels": 2, "done": 0, "survivors": [], "job": "abcd", "dropped": 0, "queried": []},
        {"levels": 2, "done": 0, "survivors": 5, "job": None, "dropped": 0, "queried": []},
        [],
        "progress",
    ],
)
def test_a_malformed_progress_is_refused(doc: object) -> None:
    with pytest.raises(ValueError, match=r"progress|job id"):
        TextProgress.from_json(doc)


@pytest.mark.parametrize(
    "text",
    [
        {"editor": {"progress": {"levels": 2}, "report_count": 3}},
        {"editor": {"progress": TextProgress(2).to_json(), "report_count": "many"}},
        {"editor": {"report_count": 3}},
        {"editor": [1, 2]},
    ],
)
def test_a_survey_state_with_a_malformed_text_progress_is_refused(
    tmp_path: Path, text: object
) -> None:
    from veil.collector.survey import State, SurveyCollectError
    from veil.survey import parse_survey

    survey = parse_survey(
        '[survey]\nname = "s"\nepsilon = 1\n[[question]]\nid = "editor"\nkind = "text"\n'
    )
    path = tmp_path / "state.json"
    good = State(survey.id, 0, 3600)
    doc = {**good.to_json(), "text": text}
    path.write_text(json.dumps(doc))
    with pytest.raises(SurveyCollectError, match="cannot resume from it"):
        State.load(path, survey, 0, 3600)
    good.text["editor"] = {"progress": TextProgress(2, 1, [(b"a", 5)]), "report_count": 9}
    good.save(path)
    again = State.load(path, survey, 0, 3600)
    assert again.text["editor"]["progress"].survivors == [(b"a", 5)]

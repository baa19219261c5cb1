"""DAP's media type (draft section 9.1) and problem documents (section 3.6)."""

from __future__ import annotations

import json

import pytest

from veil.dap.messages import Interval
from veil.dap.problems import (
    MESSAGES,
    DapAbort,
    MediaTypeError,
    Problem,
    ProblemType,
    batch_interval_seconds,
    media_type,
    message_of,
)


def test_each_message_has_its_media_type() -> None:
    assert len(MESSAGES) == 10
    assert media_type("upload-req") == "application/ppm-dap;message=upload-req"
    for message in MESSAGES:
        assert message_of(media_type(message)) == message
    with pytest.raises(ValueError, match="not a DAP message"):
        media_type("report")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("application/ppm-dap;message=upload-req", "upload-req"),
        ("Application/PPM-DAP; Message=upload-req", "upload-req"),
        ('application/ppm-dap; message="aggregate-share"', "aggregate-share"),
        ("application/ppm-dap;message=upload-req;version=19", "upload-req"),
    ],
)
def test_media_types_read(header: str, message: str) -> None:
    assert message_of(header) == message


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (None, "no Content-Type"),
        ("", "no Content-Type"),
        ("application/octet-stream", "is not application/ppm-dap"),
        ("application/dap-report", "is not application/ppm-dap"),
        ("application/ppm-dap", "needs its message parameter"),
        ("application/ppm-dap;message=report", "'report' is not a DAP message"),
        ("application/ppm-dap;message=Upload-Req", "is not a DAP message"),
        ("application/ppm-dap;message=upload-req;message=upload-req", "malformed"),
        ("application/ppm-dap;message", "malformed"),
        ("application/ppm-dap;charset=utf-8;message=upload-req", "unknown media type parameter"),
    ],
)
def test_other_media_types_are_refused(header: str | None, error: str) -> None:
    with pytest.raises(MediaTypeError, match=error):
        message_of(header)


def test_problem_document() -> None:
    task_id = bytes.fromhex("f016344736" + "4ccf1bc0e3affcca6873c9c381f64acdf9020662f83f46c07219e7")
    problem = Problem(ProblemType.UNRECOGNIZED_TASK, "no such task", 404, task_id)
    doc = json.loads(problem.to_json())
    assert doc["type"] == "urn:ietf:params:ppm:dap:error:unrecognizedTask"
    assert doc["status"] == 404 and doc["detail"] == "no such task"
    # The draft's example task id in base64url without padding.
    assert doc["taskid"] == "8BY0RzZMzxvA46_8ymhzycOB9krN-QIGYvg_RsByGec"
    assert Problem.from_json(problem.to_json(), 404) == problem
    unsupported = Problem(ProblemType.UNSUPPORTED_EXTENSION, "x", unsupported_extensions=(23, 42))
    assert json.loads(unsupported.to_json())["unsupported_extensions"] == [23, 42]
    assert Problem.from_json(unsupported.to_json(), 400) == unsupported


def test_every_problem_type_is_a_dap_urn() -> None:
    names = [t.value for t in ProblemType]
    assert len(names) == 11 and len(set(names)) == 11
    for t in ProblemType:
        assert t.urn == f"urn:ietf:params:ppm:dap:error:{t.value}"
        assert Problem.from_json(Problem(t, "d").to_json(), 400).type is t


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"type": "about:blank"}',
        b'{"type": "urn:ietf:params:ppm:dap:error:notAType"}',
    ],
)
def test_other_bodies_are_not_dap_problems(body: bytes) -> None:
    with pytest.raises(ValueError):
        Problem.from_json(body, 400)


def test_a_problem_is_an_error_status() -> None:
    with pytest.raises(ValueError, match="4xx or 5xx"):
        Problem(ProblemType.INVALID_MESSAGE, "x", 200)
    odd = b'{"type": "urn:ietf:params:ppm:dap:error:batchInvalid", "taskid": "!!", "detail": 3,'
    odd += b' "unsupported_extensions": [1, "a", 70000]}'
    problem = Problem.from_json(odd, 400)
    assert (
        problem.task_id is None and problem.detail == "" and problem.unsupported_extensions == (1,)
    )


def test_a_batch_interval_is_counted_in_seconds_and_refused_empty_or_past_the_range() -> None:
    task_id = bytes(range(32))
    assert batch_interval_seconds(task_id, Interval(1_000, 2), 3600) == (3_600_000, 7200)
    # The last interval that ends before 2^63 seconds is taken.
    assert batch_interval_seconds(task_id, Interval(2**63 - 2, 1), 1) == (2**63 - 2, 1)
    for interval, tp in ((Interval(1_000, 0), 3600), (Interval(2**63 - 1, 1), 1)):
        with pytest.raises(DapAbort) as raised:
            batch_interval_seconds(task_id, interval, tp)
        problem = raised.value.problem
        assert (problem.type, problem.status, problem.task_id) == (
            ProblemType.BATCH_INVALID,
            400,
            task_id,
        )
        assert problem.detail == "a batch interval is non-empty and within the time range"

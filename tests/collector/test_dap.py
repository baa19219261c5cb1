"""veil.collector.dap: the collector of a DAP task against a leader on
loopback that answers what each test tells it to (a real HTTP server), so
that every answer a collector parses from the network can be hostile: a
refusal's problem document, a wrong media type, a malformed or truncated
CollectionJobResp, one for another interval, shares that do not open, no
Location, a redirect. Each is a CollectionError naming what was wrong, and the honest
answer, sealed as a leader and a helper seal (DAP's AggregateShareAad),
is collected exactly after them."""

from __future__ import annotations

import math
from collections.abc import Iterator

import grpc
import pytest

from tests.dap.scripted_server import Answer, ScriptedServer
from veil.collector import (
    CollectionError,
    CollectionJobFailed,
    CollectionResult,
    Collector,
    DapCollector,
    UnusableTask,
    collector_for,
)
from veil.dap.jobs import CollectionJobReq, CollectionJobResp, Query
from veil.dap.messages import BatchMode, Interval
from veil.dap.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemType, media_type
from veil.dap.shares import seal_aggregate_share
from veil.dap.versions import DapVersion, Role
from veil.dp.accounting import Guarantee
from veil.hpke import Ciphertext
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task

TP = 3600
WHEN = 480_000  # time precisions since the epoch


@pytest.fixture(scope="module")
def leader() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def files(leader: ScriptedServer) -> TaskFiles:
    return _task(DapSpec(leader.url, "http://127.0.0.1:9/", DapVersion.DAP_19.value, "veil"))


def _task(dap: DapSpec | None) -> TaskFiles:
    addresses = ("127.0.0.1:1", "127.0.0.1:2")
    return new_task(VdafSpec("count"), *addresses, min_batch_size=2, dp=DpSpec("none"), dap=dap)


REQUEST = CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(WHEN, 1)))
# The job's id as the leader names it: 16 bytes, unpadded base64url; its
# Location relative to the task's URL ({leader}/tasks/{task-id}/).
JOB = bytes(range(16))
JOB_PATH = "collection_jobs/AAECAwQFBgcICQoLDA0ODw"
CREATED = Answer(201, headers={"Location": JOB_PATH, "Retry-After": "1"})


def _resp(
    files: TaskFiles,
    shares: tuple[list[int], list[int]],
    count: int,
    request: CollectionJobReq = REQUEST,
) -> CollectionJobResp:
    """A CollectionJobResp as an honest leader and helper seal it for `request`."""
    task = files.collector
    vdaf = task.vdaf.instantiate()
    sealed = [
        seal_aggregate_share(
            DapVersion.DAP_19,
            task.collector_hpke_keypair.config,
            role,
            task.task_id,
            task.dap_configuration(),
            request,
            vdaf.encode_agg_share(share),
        )
        for role, share in zip((Role.LEADER, Role.HELPER), shares, strict=True)
    ]
    return CollectionJobResp(count, Interval(WHEN, 1), sealed[0], sealed[1])


def _finished(body: bytes, content_type: str = media_type("collection-job-resp")) -> Answer:
    return Answer(200, body, {"Content-Type": content_type})


def _problem(kind: ProblemType, detail: str, status: int = 400) -> Answer:
    body = Problem(kind, detail, status).to_json()
    return Answer(status, body, {"Content-Type": PROBLEM_MEDIA_TYPE})


def _collect(leader: ScriptedServer, files: TaskFiles, *answers: Answer) -> CollectionResult:
    leader.answers = list(answers)
    leader.seen.clear()
    return DapCollector(files.collector).collect(WHEN * TP, TP, wait=10, poll_interval=0.01)


def _honest(files: TaskFiles) -> bytes:
    p = files.collector.vdaf.instantiate().field.MODULUS
    return _resp(files, ([5], [p - 2]), 3).encode()


def test_a_batch_is_collected_and_the_requests_are_the_drafts(
    leader: ScriptedServer, files: TaskFiles
) -> None:
    # The leader defers twice (200 empty), then answers: 5 + (-2) = 3.
    result = _collect(leader, files, CREATED, Answer(200), Answer(200), _finished(_honest(files)))
    assert result.estimate == 3 and result.report_count == 3
    assert result.collection_job_id == JOB  # the leader's name for it
    (method, path, headers, body), *polls = leader.seen
    assert (method, path) == ("POST", f"/tasks/{files.collector.id_text}/collection_jobs")
    assert headers["content-type"] == media_type("collection-job-req")
    assert headers["authorization"] == f"Bearer {files.collector.collector_token}"
    assert body == REQUEST.encode()
    job = f"/tasks/{files.collector.id_text}/{JOB_PATH}"
    assert [(m, p) for m, p, _, _ in polls] == [("GET", job)] * 3
    assert all(h["authorization"] == headers["authorization"] for _, _, h, _ in polls)


def test_a_leader_that_is_busy_is_asked_again(leader: ScriptedServer, files: TaskFiles) -> None:
    busy = Answer(503, b"backlog full", {"Retry-After": "1"})
    result = _collect(leader, files, busy, CREATED, busy, _finished(_honest(files)))
    assert result.estimate == 3


@pytest.mark.parametrize(
    ("answers", "code", "says"),
    [
        (
            [_problem(ProblemType.BATCH_OVERLAP, "the batch was collected")],
            grpc.StatusCode.FAILED_PRECONDITION,
            "batchOverlap: the batch was collected",
        ),
        (
            [_problem(ProblemType.UNRECOGNIZED_TASK, "no such task", 404)],
            grpc.StatusCode.NOT_FOUND,
            "unrecognizedTask",
        ),
        ([Answer(401, b"{}")], grpc.StatusCode.UNAUTHENTICATED, "token was refused"),
        ([Answer(400, b"<html>")], grpc.StatusCode.INVALID_ARGUMENT, "no DAP problem"),
        ([Answer(201)], grpc.StatusCode.INTERNAL, "without a Location"),
        ([Answer(200)], grpc.StatusCode.INTERNAL, "answered the collection job request 200"),
    ],
    ids=["problem", "unknown-task", "401", "not-a-problem", "no-location", "not-created"],
)
def test_a_refused_creation_is_a_clear_error(
    leader: ScriptedServer,
    files: TaskFiles,
    answers: list[Answer],
    code: grpc.StatusCode,
    says: str,
) -> None:
    with pytest.raises(CollectionError) as refused:
        _collect(leader, files, *answers)
    assert refused.value.code is code
    assert says in refused.value.message


def test_a_job_named_by_its_id_is_polled_not_created(
    leader: ScriptedServer, files: TaskFiles
) -> None:
    """`collection_job_id` resumes the job the leader named (on_job tells
    it once the job is created): only GETs of its resource, and the same
    result."""
    named: list[bytes] = []
    leader.answers = [CREATED, _finished(_honest(files))]
    collector = DapCollector(files.collector)
    first = collector.collect(WHEN * TP, TP, wait=10, poll_interval=0.01, on_job=named.append)
    assert named == [JOB]
    leader.answers = [Answer(200), _finished(_honest(files))]
    leader.seen.clear()
    again = collector.collect(
        WHEN * TP, TP, wait=10, poll_interval=0.01, collection_job_id=JOB, on_job=named.append
    )
    assert (again.estimate, again.collection_job_id, named) == (first.estimate, JOB, [JOB])
    where = f"/tasks/{files.collector.id_text}/collection_jobs/AAECAwQFBgcICQoLDA0ODw"
    assert [(m, p) for m, p, _, _ in leader.seen] == [("GET", where)] * 2
    # A leader naming its job otherwise than by 16 bytes: collected, no id.
    other = Answer(201, headers={"Location": "collection_jobs/job"})
    leader.answers = [other, _finished(_honest(files))]
    assert collector.collect(WHEN * TP, TP, wait=10, poll_interval=0.01).collection_job_id is None


def test_a_batch_the_leader_chose_is_collected_whatever_it_names_its_job(
    leader: ScriptedServer,
) -> None:
    """collect_next gives the batch the leader chose with the job's id where
    the leader names it by 16 bytes, and without one (None, as `collect`)
    where it names it otherwise: the batch's result, already released and
    opened, is not thrown away for the form of a URL (asking again would
    give the next batch, not this one)."""
    dap = DapSpec(leader.url, "http://127.0.0.1:9/", batch_mode="leader-selected")
    files = _task(dap)
    p = files.collector.vdaf.instantiate().field.MODULUS
    request = CollectionJobReq(Query(BatchMode.LEADER_SELECTED))
    honest = _finished(_resp(files, ([5], [p - 2]), 3, request).encode())
    collector = DapCollector(files.collector)
    for location, job_id in (
        (JOB_PATH, JOB),
        ("collection_jobs/3f2c5e1a-9b7d-4e6f-8a1b-2c3d4e5f6a7b", None),
        ("collection_jobs/job", None),
    ):
        leader.answers = [Answer(201, headers={"Location": location}), honest]
        result = collector.collect_next(wait=10, poll_interval=0.01)
        assert (result.estimate, result.report_count) == (3, 3)
        assert (result.start, result.duration) == (WHEN * TP, TP)
        assert result.collection_job_id == job_id, location


def test_a_hostile_job_id_is_refused_before_anything_is_sent(
    leader: ScriptedServer, files: TaskFiles
) -> None:
    """An id of another length is refused before any request; a job the
    leader does not hold in this task (another task's) is its refusal,
    named; one of another batch does not pass as this batch's."""
    collector = DapCollector(files.collector)
    leader.seen.clear()
    for bad in (b"", bytes(15), bytes(17), bytes(32)):
        with pytest.raises(ValueError, match="16 bytes"):
            collector.collect(WHEN * TP, TP, collection_job_id=bad)
    assert leader.seen == []
    leader.answers = [
        _problem(ProblemType.INVALID_MESSAGE, "no collection job x in this task", 404)
    ]
    with pytest.raises(CollectionError) as refused:
        collector.collect(WHEN * TP, TP, wait=10, poll_interval=0.01, collection_job_id=JOB)
    assert refused.value.code is grpc.StatusCode.NOT_FOUND
    assert "invalidMessage: no collection job x in this task" in refused.value.message
    assert [m for m, _, _, _ in leader.seen] == ["GET"]
    # The job of the hour before: its answer is not within this batch.
    for when in (WHEN - 1, WHEN + 1):
        with pytest.raises(CollectionError) as refused:
            leader.answers = [_finished(_honest(files))]
            collector.collect(when * TP, TP, wait=10, poll_interval=0.01, collection_job_id=JOB)
        assert f"was collection job {JOB.hex()} created for the batch" in refused.value.message
    # Within a wider batch, its shares do not open under that batch's request.
    leader.answers = [_finished(_honest(files))]
    with pytest.raises(CollectionError) as refused:
        collector.collect(WHEN * TP, 2 * TP, wait=10, poll_interval=0.01, collection_job_id=JOB)
    assert refused.value.code is grpc.StatusCode.DATA_LOSS
    assert "cannot open" in refused.value.message and JOB.hex() in refused.value.message


def test_the_token_goes_nowhere_but_the_tasks_jobs_at_the_leader(
    leader: ScriptedServer, files: TaskFiles
) -> None:
    """A Location on another origin (host, port or scheme, or
    protocol-relative) or outside the task's collection jobs is refused,
    naming it, with nothing more sent: a second real server on loopback,
    where each points, is never called, and the leader only had the
    POST. A redirect of a poll to that server is not followed either."""
    other = ScriptedServer()
    try:
        port = other.url.rsplit(":", 1)[1].rstrip("/")
        mine = leader.url.rsplit(":", 1)[1].rstrip("/")
        job = f"tasks/{files.collector.id_text}/{JOB_PATH}"
        for location in (
            f"{other.url}{job}",  # another port
            f"http://localhost:{mine}/{job}",  # another host name
            f"https://127.0.0.1:{mine}/{job}",  # another scheme
            f"//127.0.0.1:{port}/{job}",  # protocol-relative
            f"http://x@127.0.0.1:{mine}/{job}",  # user information
            "/tasks/AAAA/collection_jobs/AAECAwQFBgcICQoLDA0ODw",  # another task
            f"/tasks/{files.collector.id_text}/aggregation_jobs/x",  # not a job
            f"/tasks/{files.collector.id_text}/collection_jobs/",  # the jobs, not one
            f"/tasks/{files.collector.id_text}/collection_jobs/%2e%2e/x",
            "/",
        ):
            leader.answers = [Answer(201, headers={"Location": location})]
            leader.seen.clear()
            with pytest.raises(CollectionError) as refused:
                DapCollector(files.collector).collect(WHEN * TP, TP, wait=10, poll_interval=0.01)
            assert f"named its collection job elsewhere: the Location {location!r}" in (
                refused.value.message
            )
            assert [m for m, _, _, _ in leader.seen] == ["POST"], location
        # A poll answered by a redirect to the other server.
        for status in (301, 302, 303, 307, 308):
            redirect = Answer(status, headers={"Location": f"{other.url}{job}"})
            leader.answers = [CREATED, redirect]
            with pytest.raises(
                CollectionError, match=f"answered a poll of its collection job {status}"
            ):
                DapCollector(files.collector).collect(WHEN * TP, TP, wait=10, poll_interval=0.01)
        assert other.seen == []
        # Control: the same server, named as the task's, is reached.
        # Controls: the leader's own origin, absolute, is followed; and the
        # other server, where a task names it as its leader, is reached.
        leader.answers = [Answer(201, headers={"Location": f"{leader.url}{job}"})]
        leader.answers.append(_finished(_honest(files)))
        assert (
            DapCollector(files.collector)
            .collect(WHEN * TP, TP, wait=10, poll_interval=0.01)
            .estimate
            == 3
        )
        there = _task(DapSpec(other.url, "http://127.0.0.1:9/", DapVersion.DAP_19.value, "veil"))
        other.answers = [CREATED, _finished(_honest(there))]
        assert (
            DapCollector(there.collector)
            .collect(WHEN * TP, TP, wait=10, poll_interval=0.01)
            .estimate
            == 3
        )
        assert [m for m, _, _, _ in other.seen] == ["POST", "GET"]
    finally:
        other.close()


def test_a_redirected_collection_job_request_is_told_as_a_redirect(
    leader: ScriptedServer, files: TaskFiles
) -> None:
    """The leader answering the collection job request with a redirect to
    another real server on loopback: the error says so, naming the status
    and the Location, and that veil follows no redirect with the
    collector's token (it said the leader answered "without a Location");
    the other server is never called, nor is the job told to `on_job`."""
    other = ScriptedServer()
    named: list[bytes] = []
    try:
        there = f"{other.url}tasks/{files.collector.id_text}/collection_jobs"
        for status, location in [(s, there) for s in (301, 302, 303, 307, 308)] + [(302, None)]:
            leader.answers = [Answer(status, headers={"Location": location} if location else {})]
            leader.seen.clear()
            with pytest.raises(CollectionError) as refused:
                DapCollector(files.collector).collect(
                    WHEN * TP, TP, wait=10, poll_interval=0.01, on_job=named.append
                )
            to = f"to {location!r}" if location else "without a Location"
            assert refused.value.message == (
                f"the DAP leader at {leader.url} answered the collection job request {status},"
                f" a redirect {to}: veil follows no redirect, which would carry the collector's"
                " token elsewhere (the task's leader_endpoint must be where the leader answers)"
            )
            assert [m for m, _, _, _ in leader.seen] == ["POST"]
        assert other.seen == [] and named == []
    finally:
        other.close()
    # Other answers without a Location are told as before.
    leader.answers = [Answer(200)]
    with pytest.raises(CollectionError, match="request 200 without a Location"):
        DapCollector(files.collector).collect(WHEN * TP, TP, wait=10, poll_interval=0.01)


def test_a_failed_job_is_told_as_failed(leader: ScriptedServer, files: TaskFiles) -> None:
    failed = _problem(ProblemType.BATCH_INVALID, "the helper refused the batch")
    with pytest.raises(CollectionJobFailed, match="batchInvalid: the helper refused the batch"):
        _collect(leader, files, CREATED, failed)


def _hostile_answers(files: TaskFiles) -> dict[str, tuple[Answer, str]]:
    honest = _honest(files)
    resp = CollectionJobResp.decode(honest)
    elsewhere = CollectionJobResp(3, Interval(WHEN + 1, 1), *_shares(resp))
    wider = CollectionJobResp(3, Interval(WHEN, 2), *_shares(resp))
    leader, helper = _shares(resp)
    garbled = Ciphertext(leader.config_id, leader.enc, bytes(len(leader.payload)))
    return {
        "media type": (
            _finished(honest, "application/octet-stream"),
            "is not application/ppm-dap",
        ),
        "another message": (_finished(honest, media_type("aggregate-share")), "CollectionJobResp"),
        "truncated": (_finished(honest[:-1]), "without a CollectionJobResp"),
        "trailing bytes": (_finished(honest + b"\0"), "without a CollectionJobResp"),
        "cut in its interval": (_finished(honest[:12]), "without a CollectionJobResp"),
        "another interval": (_finished(elsewhere.encode()), "not within the query's"),
        "a wider interval": (_finished(wider.encode()), "not within the query's"),
        "a share that does not open": (
            _finished(CollectionJobResp(3, resp.interval, garbled, helper).encode()),
            "cannot open the leader's aggregate share",
        ),
        "shares swapped": (
            _finished(CollectionJobResp(3, resp.interval, helper, leader).encode()),
            "cannot open the leader's aggregate share",
        ),
    }


def _shares(resp: CollectionJobResp) -> tuple[Ciphertext, Ciphertext]:
    return resp.leader_encrypted_agg_share, resp.helper_encrypted_agg_share


HOSTILE = [
    "media type",
    "another message",
    "truncated",
    "trailing bytes",
    "cut in its interval",
    "another interval",
    "a wider interval",
    "a share that does not open",
    "shares swapped",
]


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_collection_job_resp_is_a_clear_error(
    leader: ScriptedServer, files: TaskFiles, case: str
) -> None:
    answer, says = _hostile_answers(files)[case]
    with pytest.raises(CollectionError) as refused:
        _collect(leader, files, CREATED, answer)
    assert says in refused.value.message
    assert refused.value.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS)
    # The honest answer is collected after it.
    assert _collect(leader, files, CREATED, _finished(_honest(files))).estimate == 3


def test_an_unreachable_leader_is_named(files: TaskFiles) -> None:
    dap = DapSpec("http://127.0.0.1:9/", "http://127.0.0.1:9/", DapVersion.DAP_19.value, "veil")
    task = _task(dap).collector
    with pytest.raises(CollectionError) as refused:
        DapCollector(task).collect(WHEN * TP, TP, wait=0.5)
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert "cannot reach the DAP leader at http://127.0.0.1:9/" in refused.value.message


def test_the_protocol_is_chosen_by_task_or_by_name(files: TaskFiles) -> None:
    assert isinstance(collector_for(files.collector), DapCollector)
    grpc_task = _task(None).collector
    with collector_for(grpc_task) as chosen:
        assert isinstance(chosen, Collector)
    with pytest.raises(UnusableTask, match="not served over DAP"):
        collector_for(grpc_task, protocol="dap")
    with pytest.raises(ValueError, match="'grpc' or 'dap'"):
        collector_for(files.collector, protocol="http")
    with pytest.raises(ValueError, match="not whole time precisions"):
        DapCollector(files.collector).collect(WHEN * TP + 1, TP)


@pytest.mark.parametrize("other", [None, "helper"])
def test_the_interval_is_from_the_noise_actually_added(
    leader: ScriptedServer, other: str | None
) -> None:
    # ε = 1 on a count (Δ = 1): each veil aggregator adds one discrete Laplace of
    # scale 1, whose P(|Z| <= c) = 1 - 2q^(c+1)/(1+q) with q = e^-1 (one draw), and
    # the sum of two such when both are veil. The 95% half-width is the least c
    # that holds that mass: 3 for one draw, 4 for two (from the sum's pmf).
    dap = DapSpec(leader.url, "http://127.0.0.1:9/", other_implementation=other)
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=2,
        dp=DpSpec("geometric", epsilon="1"), dap=dap,
    )  # fmt: skip
    q = math.exp(-1)
    one = min(c for c in range(50) if 1 - 2 * q ** (c + 1) / (1 + q) >= 0.95)
    pmf = {z: math.tanh(0.5) * q ** abs(z) for z in range(-60, 61)}
    two_pmf = {z: sum(pmf[k] * pmf.get(z - k, 0.0) for k in pmf) for z in range(-50, 51)}
    two = min(c for c in range(50) if sum(two_pmf[z] for z in range(-c, c + 1)) >= 0.95)
    assert (one, two) == (3, 4)
    leader.answers = [CREATED, _finished(_honest(files))]
    leader.seen.clear()
    result = DapCollector(files.collector).collect(WHEN * TP, TP, wait=10, poll_interval=0.01)
    assert result.estimate == 3 and result.confidence == 0.95
    assert result.upper - result.estimate == result.estimate - result.lower
    assert result.upper - result.estimate == (one if other else two)
    assert result.noise_added_by == (("leader",) if other else ("leader", "helper"))
    assert result.against_collector == Guarantee.pure(1)


def test_a_collection_job_is_deleted_and_a_refusal_named(
    leader: ScriptedServer, files: TaskFiles
) -> None:
    """DapCollector.delete sends the draft's DELETE to the job's resource,
    with the collector's token; a refusal is a CollectionError naming it,
    and a busy leader is asked again."""
    collector = DapCollector(files.collector)
    job = bytes(range(16))
    busy = Answer(503, b"backlog full", {"Retry-After": "1"})
    leader.answers = [busy, Answer(200)]
    leader.seen.clear()
    collector.delete(job)
    where = f"/tasks/{files.collector.id_text}/collection_jobs/AAECAwQFBgcICQoLDA0ODw"
    assert [(m, p) for m, p, _, _ in leader.seen] == [("DELETE", where)] * 2
    assert all(
        h["authorization"] == f"Bearer {files.collector.collector_token}"
        for _, _, h, _ in leader.seen
    )
    for answer, code, says in [
        (
            _problem(ProblemType.INVALID_MESSAGE, "no collection job of that id", 404),
            grpc.StatusCode.NOT_FOUND,
            "invalidMessage: no collection job of that id",
        ),
        (Answer(401, b"{}"), grpc.StatusCode.UNAUTHENTICATED, "token was refused"),
        (Answer(204), grpc.StatusCode.INTERNAL, "deletion of its collection job 204"),
    ]:
        leader.answers = [answer]
        with pytest.raises(CollectionError) as refused:
            collector.delete(job)
        assert refused.value.code is code and says in refused.value.message

"""The leader's request to the helper is built in one place
(veil.aggregator.leader.helper_client.aggregation_job_request) and its bytes
are those GrpcHelperClient sent when it built the request itself: the same
fixed reports, without and with a Poplar1 round, against the request spelled
out as the client built it, and as a gRPC server receives it from the client."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import pytest

from veil.aggregator.core import VerifyInitItem
from veil.aggregator.leader.helper_client import GrpcHelperClient, aggregation_job_request
from veil.hpke import Ciphertext
from veil.protocol.v1 import helper_pb2, messages_pb2
from veil.task import DpSpec, VdafSpec, new_task

TASK_ID = bytes(range(32))
JOB_ID = bytes(range(100, 116))
ITEMS = [
    VerifyInitItem(
        b"\x01" * 16, 1_800_000_000, b"public", Ciphertext(7, b"e" * 32, b"payload"), b"vs-1"
    ),
    # A Poplar1 round-2 item: the second sketch share set; a report time of 0
    # and an empty public share (proto3 leaves both off the wire).
    VerifyInitItem(b"\x02" * 16, 0, b"", Ciphertext(0, b"f" * 32, b"p" * 40), b"vs-2", b"vs-2b"),
]
ROUNDS = [None, (b"\x00\x03agg-param", 1_800_000_000 - 3600, 3600, 2)]


def spelled_out(
    task_id: bytes,
    job_id: bytes,
    items: Sequence[VerifyInitItem],
    prefix_round: tuple[bytes, int, int, int] | None,
) -> helper_pb2.AggregationJobRequest:
    """The request as GrpcHelperClient.aggregate built it before the builder."""
    request = helper_pb2.AggregationJobRequest(task_id=task_id, aggregation_job_id=job_id)
    if prefix_round is not None:
        agg_param, start, duration, round_ = prefix_round
        request.agg_param = agg_param
        request.batch_interval.CopyFrom(messages_pb2.Interval(start=start, duration=duration))
        request.round = round_
    for it in items:
        v = request.verify_inits.add(
            leader_verifier_share=it.leader_verifier_share,
            leader_verifier_share_2=it.leader_verifier_share_2,
        )
        v.report_share.metadata.report_id = it.report_id
        v.report_share.metadata.time = it.time
        v.report_share.public_share = it.public_share
        ct, pb = it.encrypted_input_share, v.report_share.encrypted_input_share
        pb.config_id, pb.enc, pb.payload = ct.config_id, ct.enc, ct.payload
    return request


@pytest.mark.parametrize("prefix_round", ROUNDS, ids=["prio3", "poplar1 round"])
def test_builder_gives_the_bytes_the_client_sent(
    prefix_round: tuple[bytes, int, int, int] | None,
) -> None:
    built = aggregation_job_request(TASK_ID, JOB_ID, ITEMS, prefix_round)
    wire = built.SerializeToString()
    assert wire == spelled_out(TASK_ID, JOB_ID, ITEMS, prefix_round).SerializeToString()
    # Every field reached the wire, and reads back as it was given.
    back = helper_pb2.AggregationJobRequest.FromString(wire)
    assert (back.task_id, back.aggregation_job_id) == (TASK_ID, JOB_ID)
    got = [
        VerifyInitItem(
            v.report_share.metadata.report_id,
            v.report_share.metadata.time,
            v.report_share.public_share,
            Ciphertext(
                v.report_share.encrypted_input_share.config_id,
                v.report_share.encrypted_input_share.enc,
                v.report_share.encrypted_input_share.payload,
            ),
            v.leader_verifier_share,
            v.leader_verifier_share_2,
        )
        for v in back.verify_inits
    ]
    assert got == ITEMS
    if prefix_round is None:
        assert not back.HasField("batch_interval")
        assert (back.agg_param, back.round) == (b"", 0)
    else:
        interval = back.batch_interval
        assert (back.agg_param, interval.start, interval.duration, back.round) == prefix_round


class RecordingHelper:
    """A gRPC server in the helper's place that keeps each Aggregate call's
    request bytes as they arrived and answers with an empty job response."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()
        handler = grpc.method_handlers_generic_handler(
            helper_pb2.DESCRIPTOR.services_by_name["Helper"].full_name,
            {"Aggregate": grpc.unary_unary_rpc_method_handler(self.aggregate)},
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def aggregate(self, raw: bytes, context: Any) -> bytes:
        with self.lock:
            self.requests.append(raw)
            self.metadata.append(dict(context.invocation_metadata()))
        return b""


@pytest.fixture
def recording() -> Iterator[RecordingHelper]:
    helper = RecordingHelper()
    yield helper
    helper.server.stop(None)


def test_client_sends_the_builders_bytes(recording: RecordingHelper) -> None:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        f"127.0.0.1:{recording.port}",
        min_batch_size=1,
        dp=DpSpec("none"),
    )
    client = GrpcHelperClient(grpc.insecure_channel, timeout=30)
    task = files.leader
    for prefix_round in ROUNDS:
        answer = client.aggregate(task, JOB_ID, ITEMS, prefix_round)
        assert answer.results == [] and answer.helper_time is None
    expected = []
    for r in ROUNDS:
        request = spelled_out(task.task_id, JOB_ID, ITEMS, r)
        # And the task's window as the leader's file gives it, for the
        # helper to compare with its own.
        request.task_window.not_before, request.task_window.not_after = task.window
        expected.append(request.SerializeToString())
    assert recording.requests == expected
    assert all(m["authorization"] == f"Bearer {task.aggregator_token}" for m in recording.metadata)

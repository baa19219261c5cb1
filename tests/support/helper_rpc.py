"""A real helper driven over gRPC with the leader bypassed, as a leader (or
anyone holding the leader's token) could: verify-init items built as an
honest leader builds them (`honest_items`, bench.helper_jobs, which the
benchmark of the helper shares), and one aggregation job sent straight to
the helper in the request the leader builds."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import grpc

from bench.helper_jobs import honest_items
from veil.aggregator.core import VerifyInitItem
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.protocol.v1 import helper_pb2, helper_pb2_grpc
from veil.task import LeaderTask

__all__ = ["aggregate", "honest_items"]


def aggregate(
    helper_address: str, leader: LeaderTask, items: Sequence[VerifyInitItem]
) -> list[helper_pb2.VerifyResp]:
    """One aggregation job sent straight to the helper, with the leader's token."""
    auth = (("authorization", f"Bearer {leader.aggregator_token}"),)
    with grpc.insecure_channel(helper_address) as channel:
        req = aggregation_job_request(leader.task_id, secrets.token_bytes(16), items)
        reply = helper_pb2_grpc.HelperStub(channel).Aggregate(req, metadata=auth, timeout=30)
        return list(reply.verify_resps)

"""A real helper driven over gRPC with the leader bypassed, as a leader (or
anyone holding the leader's token) could: verify-init items built as an
honest leader builds them, and one aggregation job sent straight to the
helper."""

from __future__ import annotations

import secrets
import time

import grpc

from veil.client.prepare import seal_report
from veil.hpke import HpkeConfig
from veil.messages import vdaf_ctx
from veil.protocol.v1 import helper_pb2, helper_pb2_grpc, messages_pb2
from veil.task import LeaderTask


def verify_init(
    leader: LeaderTask, configs: tuple[HpkeConfig, HpkeConfig], helper_token: bytes, rid: bytes
) -> helper_pb2.VerifyInit:
    """A report of `leader`'s task as the leader would forward it, with the
    leader's real verifier share, whose helper share is sealed with
    `helper_token` (`configs`: the leader's and the helper's HPKE configs)."""
    vdaf = leader.vdaf.instantiate()
    ctx = vdaf_ctx(leader.task_id)
    public_share, shares = vdaf.shard(ctx, 1, rid, secrets.token_bytes(vdaf.RAND_SIZE))
    enc_public = vdaf.encode_public_share(public_share)
    t = int(time.time()) // leader.time_precision * leader.time_precision
    report = seal_report(
        leader.task_id,
        rid,
        t,
        enc_public,
        vdaf.encode_input_share(shares[0]),
        vdaf.encode_input_share(shares[1]),
        *configs,
        helper_token,
    )
    _, leader_verifier = vdaf.verify_init(
        leader.verify_key, ctx, 0, None, rid, public_share, shares[0]
    )
    return helper_pb2.VerifyInit(
        report_share=helper_pb2.ReportShare(
            metadata=messages_pb2.ReportMetadata(report_id=rid, time=t),
            public_share=enc_public,
            encrypted_input_share=messages_pb2.HpkeCiphertext(
                config_id=report.helper_ct.config_id,
                enc=report.helper_ct.enc,
                payload=report.helper_ct.payload,
            ),
        ),
        leader_verifier_share=vdaf.encode_verifier_share(leader_verifier),
    )


def aggregate(
    helper_address: str, leader: LeaderTask, items: list[helper_pb2.VerifyInit]
) -> list[helper_pb2.VerifyResp]:
    """One aggregation job sent straight to the helper, with the leader's token."""
    auth = (("authorization", f"Bearer {leader.aggregator_token}"),)
    with grpc.insecure_channel(helper_address) as channel:
        req = helper_pb2.AggregationJobRequest(
            task_id=leader.task_id,
            aggregation_job_id=secrets.token_bytes(16),
            verify_inits=items,
        )
        reply = helper_pb2_grpc.HelperStub(channel).Aggregate(req, metadata=auth, timeout=30)
        return list(reply.verify_resps)

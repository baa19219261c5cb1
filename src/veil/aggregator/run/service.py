"""The gRPC services of the leader and helper: thin adapters over the logic.

Each handler decodes the request into the logic's values, calls the logic,
encodes the answer and maps AggregatorError to its gRPC status. Nothing here
decides anything. The handlers are synchronous; `add_service` serves them on
veil.aggregator.run.transport's server, which runs them once their request has
arrived, and checks a call's token from its metadata before reading it.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from veil.aggregator.core import VerifyInitItem
from veil.aggregator.errors import (
    AggregatorError,
    Internal,
    InvalidMessage,
    ReportRejection,
    Unauthenticated,
    Unavailable,
)
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.run.transport import Metadata, RpcServer, UnaryMethod, refusal
from veil.aggregator.store.records import CollectionRecord, is_transient_storage_error
from veil.aggregator.wire import REJECTION_TO_PB, interval_pb, window_from_pb
from veil.hpke import Ciphertext
from veil.messages import MessageError
from veil.messages.wire import (
    ciphertext_from_pb,
    ciphertext_to_pb,
    hpke_config_to_pb,
    hpke_configs_to_pb,
    report_batch_from_upload,
)
from veil.metrics import Metrics
from veil.protocol.v1 import helper_pb2, helper_pb2_grpc, leader_pb2, leader_pb2_grpc, messages_pb2
from veil.task import hash_token

log = logging.getLogger(__name__)

T = TypeVar("T")


def bearer_token(context: grpc.ServicerContext) -> str | None:
    return bearer_token_of(context.invocation_metadata() or ())


def bearer_token_of(metadata: Metadata) -> str | None:
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def token_check(accepted: Callable[[], Iterable[bytes]], who: str) -> Callable[[Metadata], None]:
    """Refuse a call from its metadata alone, before its request is read,
    unless it carries the `who` token of some served task (`accepted`: their
    SHA-256 hashes); the logic then checks the token against the request's
    own task. Every stored hash is compared, in constant time."""

    def check(metadata: Metadata) -> None:
        token = bearer_token_of(metadata)
        if token is None:
            raise refusal(
                Unauthenticated(f"missing bearer token: send 'authorization: Bearer <{who} token>'")
            )
        digest = hash_token(token)
        matches = [hmac.compare_digest(digest, stored) for stored in accepted()]
        if not any(matches):
            raise refusal(Unauthenticated(f"not the {who} token of any task served here"))

    return check


def abort(context: grpc.ServicerContext, error: AggregatorError) -> None:
    """End the call with `error`: its status and message, and its kind,
    whether to retry and any advised wait in the trailing metadata (read
    back by `from_peer` and veil.grpc_util.RpcRefused)."""
    refused = refusal(error)
    context.set_trailing_metadata(refused.trailing)
    context.abort(refused.code, refused.details)


def handler(fn: Callable[..., T]) -> Callable[..., T]:
    """Map logic errors to gRPC statuses; never leak internals of other failures.

    A failure of the server's own database (locked, restarting, unreachable)
    is Unavailable: the caller retries the same request later."""

    @functools.wraps(fn)
    def wrapped(self: Any, request: Any, context: grpc.ServicerContext) -> T:
        try:
            return fn(self, request, context)
        except AggregatorError as e:
            abort(context, e)
        except MessageError as e:
            abort(context, InvalidMessage(str(e)))
        except Exception as e:
            if is_transient_storage_error(e):
                log.warning("storage unavailable in %s: %s", fn.__name__, e)
                abort(context, Unavailable("the server's database is unavailable; retry later"))
            log.exception("internal error in %s", fn.__name__)
            abort(context, Internal("internal error; see the server's log"))
        raise AssertionError("unreachable")

    return wrapped


def add_service(
    server: RpcServer,
    servicer: LeaderService | HelperService,
    service: ServiceDescriptor,
    metrics: Metrics | None,
) -> None:
    """Register `servicer`'s methods for `service`, parsing requests here
    rather than in gRPC: bytes that are not the request message are refused
    as INVALID_ARGUMENT naming the method, and counted
    (``veil_requests_malformed_total``), where gRPC's own parsing would
    answer INTERNAL and leave no trace in the metrics. The methods the
    servicer lists in `AUTHENTICATED` have their token checked first
    (`token_check` over the servicer's `accepted_tokens()`)."""
    who, authenticated = servicer.AUTHENTICATED
    methods = {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            raise ValueError(f"{method.full_name} streams; only unary methods are served")
        call = _parsing(
            getattr(servicer, method.name),
            GetMessageClass(method.input_type),
            method.name,
            metrics,
        )
        serialize = GetMessageClass(method.output_type).SerializeToString
        check = None
        if method.name in authenticated:
            check = token_check(servicer.accepted_tokens, who)
        methods[method.name] = UnaryMethod(_serializing(call, serialize), check)
    server.add_unary_service(service.full_name, methods)


def _serializing(
    call: Callable[[bytes, Any], Any], serialize: Callable[[Any], bytes]
) -> Callable[[bytes, Any], bytes]:
    # In the worker thread, like the rest of the call's work.
    return lambda raw, context: serialize(call(raw, context))


def _parsing(
    behaviour: Callable[[Any, grpc.ServicerContext], Any],
    request_type: type[Message],
    name: str,
    metrics: Metrics | None,
) -> Callable[[bytes, grpc.ServicerContext], Any]:
    def parse_then_call(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = request_type.FromString(raw)
        except DecodeError:
            if metrics is not None:
                metrics.requests_malformed.labels(name).inc()
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"malformed {name} request: not a {request_type.DESCRIPTOR.name} message",
            )
        return behaviour(request, context)

    return parse_then_call


class LeaderService(leader_pb2_grpc.LeaderServicer):
    # The calls that need the collector's token (see add_service).
    AUTHENTICATED = ("collector", ("CreateCollection", "GetCollection", "GetTaskInfo"))

    def __init__(self, leader: Leader) -> None:
        self.leader = leader

    def accepted_tokens(self) -> list[bytes]:
        return [t.collector_token_hash for t in self.leader.tasks.values()]

    @handler
    def GetHpkeConfig(
        self, request: messages_pb2.HpkeConfigRequest, context: grpc.ServicerContext
    ) -> messages_pb2.HpkeConfigList:
        return hpke_configs_to_pb(self.leader.hpke_configs(request.task_id))

    @handler
    def UploadReports(
        self, request: leader_pb2.UploadRequest, context: grpc.ServicerContext
    ) -> leader_pb2.UploadResponse:
        batch = report_batch_from_upload(request)
        accepted, duplicates = self.leader.upload(request.task_id, batch)
        return leader_pb2.UploadResponse(accepted=accepted, duplicates=duplicates)

    @handler
    def CreateCollection(
        self, request: leader_pb2.CreateCollectionRequest, context: grpc.ServicerContext
    ) -> leader_pb2.CollectionJob:
        record = self.leader.create_collection(
            request.task_id,
            bearer_token(context),
            request.collection_job_id,
            request.batch_interval.start,
            request.batch_interval.duration,
            request.agg_param,
        )
        return collection_to_pb(record)

    @handler
    def GetCollection(
        self, request: leader_pb2.GetCollectionRequest, context: grpc.ServicerContext
    ) -> leader_pb2.CollectionJob:
        record = self.leader.get_collection(
            request.task_id, bearer_token(context), request.collection_job_id
        )
        return collection_to_pb(record)

    @handler
    def GetTaskInfo(
        self, request: leader_pb2.TaskInfoRequest, context: grpc.ServicerContext
    ) -> leader_pb2.TaskInfo:
        info = self.leader.task_info(request.task_id, bearer_token(context))
        return leader_pb2.TaskInfo(
            collector_hpke_config=hpke_config_to_pb(info.collector_hpke_config),
            reports=info.reports,
            rejected=info.rejected,
            collections_finished=info.collections_finished,
            counts_withheld=info.counts_withheld,
        )


def collection_to_pb(r: CollectionRecord) -> leader_pb2.CollectionJob:
    state = {
        "pending": leader_pb2.CollectionJob.PENDING,
        "finished": leader_pb2.CollectionJob.FINISHED,
        "failed": leader_pb2.CollectionJob.FAILED,
    }[r.state]
    msg = leader_pb2.CollectionJob(
        state=state,
        collection_job_id=r.job_id,
        batch_interval=interval_pb(r.start, r.duration),
        agg_param=r.agg_param,
    )
    if r.state == "finished":
        assert r.leader_ct is not None and r.helper_ct is not None
        msg.report_count = r.report_count
        msg.leader_encrypted_agg_share.CopyFrom(ciphertext_to_pb(r.leader_ct))
        msg.helper_encrypted_agg_share.CopyFrom(ciphertext_to_pb(r.helper_ct))
    elif r.state == "failed":
        msg.error_code = r.error_code
        msg.error_message = r.error_message
    elif r.error_message:
        # Pending, retried after a failed attempt: the collector can say why it waits.
        msg.error_message = r.error_message
    return msg


class HelperService(helper_pb2_grpc.HelperServicer):
    # The calls that need the leader's (aggregator) token (see add_service).
    AUTHENTICATED = ("aggregator", ("Aggregate", "GetAggregateShare"))

    def __init__(self, helper: Helper) -> None:
        self.helper = helper

    def accepted_tokens(self) -> list[bytes]:
        return [t.aggregator_token_hash for t in self.helper.tasks.values()]

    @handler
    def GetHpkeConfig(
        self, request: messages_pb2.HpkeConfigRequest, context: grpc.ServicerContext
    ) -> messages_pb2.HpkeConfigList:
        return hpke_configs_to_pb(self.helper.hpke_configs(request.task_id))

    @handler
    def Aggregate(
        self, request: helper_pb2.AggregationJobRequest, context: grpc.ServicerContext
    ) -> helper_pb2.AggregationJobResponse:
        items = []
        for i, v in enumerate(request.verify_inits):
            # Each sub-message read once (every read of a field builds an object).
            share = v.report_share
            metadata = share.metadata
            ct = share.encrypted_input_share
            config_id = ct.config_id
            if config_id > 255:
                ciphertext_from_pb(ct, f"report {i}")  # refused, naming the report
            items.append(
                VerifyInitItem(
                    metadata.report_id,
                    metadata.time,
                    share.public_share,
                    Ciphertext(config_id, ct.enc, ct.payload),
                    v.leader_verifier_share,
                    v.leader_verifier_share_2,
                    v.token,
                    v.leader_share_digest,
                )
            )
        # A task queried with an aggregation parameter names it, its batch
        # and the round of the job (veil.aggregator.helper.queries).
        interval = request.batch_interval
        results = self.helper.aggregate(
            request.task_id,
            bearer_token(context),
            request.aggregation_job_id,
            items,
            request.agg_param,
            interval.start,
            interval.duration,
            request.round,
            window_from_pb(request),
        )
        # The helper's own clock, read as it answers: the leader measures the
        # skew between the aggregators from it (veil.aggregator.leader.skew).
        out = helper_pb2.AggregationJobResponse(helper_time_ms=int(self.helper.clock() * 1000))
        add = out.verify_resps.add
        for report_id, message, reject, share_2 in results:
            if message is None:
                code = REJECTION_TO_PB[reject or ReportRejection.REPORT_DROPPED]
                add(report_id=report_id, reject=code)
            elif share_2:
                add(report_id=report_id, verifier_message=message, helper_verifier_share=share_2)
            else:
                # An empty field is not sent either way; not naming it saves
                # a third of the call.
                add(report_id=report_id, verifier_message=message)
        return out

    @handler
    def GetAggregateShare(
        self, request: helper_pb2.AggregateShareRequest, context: grpc.ServicerContext
    ) -> helper_pb2.AggregateShareResponse:
        ct = self.helper.aggregate_share(
            request.task_id,
            bearer_token(context),
            request.collection_job_id,
            request.batch_interval.start,
            request.batch_interval.duration,
            request.report_count,
            request.checksum,
            request.agg_param,
            window_from_pb(request),
        )
        return helper_pb2.AggregateShareResponse(encrypted_agg_share=ciphertext_to_pb(ct))

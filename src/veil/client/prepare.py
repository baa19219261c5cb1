"""Building reports without the network (draft-ietf-ppm-dap section 4.4.2).

`prepare_reports` is everything a client does to a measurement before the
upload: draw a report id (also the VDAF nonce) and the sharding randomness,
shard with Prio3 under the task's VDAF context, and seal each input share to
its aggregator's HPKE config, binding the report metadata and public share.
A task with a local layer (`local_epsilon`, veil.dp.local) first randomizes
each measurement on this device, so the true answer never leaves it; the
randomized one is a valid measurement of the same type. Given the two
configs it needs nothing else, so `Client`, `AsyncClient`, the outbox and
the tests (which build malformed reports with `seal_report`) all share it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from veil.dp import DPError
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig, input_share_info, seal
from veil.messages import REPORT_ID_SIZE, Report, vdaf_ctx
from veil.task import Task
from veil.vdaf.batch.poplar1 import BatchPoplar1
from veil.vdaf.batch.prio3 import BatchPrio3


def seal_report(
    task_id: bytes,
    report_id: bytes,
    time: int,
    public_share: bytes,
    leader_share: bytes,
    helper_share: bytes,
    leader_config: HpkeConfig,
    helper_config: HpkeConfig,
    token: bytes = b"",
) -> Report:
    """A report from encoded shares, each sealed as an honest client seals it.

    The shares need not come from an honest sharding: tests build reports
    with tampered shares or proofs this way and check that the aggregators
    reject them. A `token` (a task with invitations) travels beside the
    shares; its challenge must commit to this report as sealed
    (veil.invite.token.report_context), so an honest client seals first,
    has the token issued for the sealed report, and sets it then.
    """
    leader_ct = seal(
        leader_config,
        input_share_info(ROLE_LEADER, task_id, report_id, time, public_share),
        leader_share,
    )
    helper_ct = seal(
        helper_config,
        input_share_info(ROLE_HELPER, task_id, report_id, time, public_share),
        helper_share,
    )
    return Report(report_id, time, public_share, leader_ct, helper_ct, token)


def randomize_measurements(task: Task, measurements: Sequence[Any]) -> Sequence[Any]:
    """Each measurement through the task's randomized response (from `secrets`),
    or unchanged without a local layer. Raises ValueError naming the report."""
    channel = task.dp.local(task.vdaf)
    if channel is None:
        return measurements
    out = []
    for i, m in enumerate(measurements):
        try:
            out.append(channel.randomize(m))
        except DPError as e:
            raise ValueError(f"report {i}: {e}") from None
    return out


def prepare_reports(
    task: Task,
    measurements: Sequence[Any],
    leader_config: HpkeConfig,
    helper_config: HpkeConfig,
    report_time: int,
    *,
    batch: BatchPrio3[Any, Any] | BatchPoplar1 | None = None,
    report_ids: Sequence[bytes] | None = None,
    invited: bool = False,
    randomized: bool = False,
) -> list[Report]:
    """Shard (on the batched path) and seal `measurements`, each with a fresh
    random report id, at `report_time` rounded down to the task's
    time_precision.

    A task with invitations takes `invited=True`: the reports come without
    their tokens, which veil.invite.client.redeem has issued for them as
    sealed (a token's challenge commits to its report's content).

    `randomized`: the measurements have been through the task's local layer
    already (`randomize_measurements`), so they are not drawn again; a survey
    does so when a breakdown sends the same randomized answer as its question.

    Raises ValueError, naming the report, on an invalid measurement. Pass
    `batch` (a `BatchPrio3` of the task's VDAF) to reuse one across calls;
    building it costs about as much as sharding a few reports.

    A poplar1 task (a text question) takes each measurement as bytes of
    exactly bits/8 bytes (`veil.survey.text` encodes a typed answer so) or
    as bits/8·8 bools, and shards it with Poplar1.

    Example, with the configs an application fetched and kept earlier::

        reports = prepare_reports(task, [1, 0, 1], leader_cfg, helper_cfg, int(time.time()))
        client.upload_reports(reports)
    """
    if task.vdaf.is_prefix:
        if not isinstance(batch, BatchPoplar1):
            batch = BatchPoplar1(task.vdaf.instantiate_poplar1())
        measurements = [_poplar1_measurement(batch, i, m) for i, m in enumerate(measurements)]
    elif batch is None:
        batch = BatchPrio3(task.vdaf.instantiate())
    if not randomized:
        measurements = randomize_measurements(task, measurements)
    t = report_time - report_time % task.time_precision
    n = len(measurements)
    if report_ids is None:
        report_ids = [secrets.token_bytes(REPORT_ID_SIZE) for _ in range(n)]
    if task.issuer_public_key is not None and not invited:
        raise ValueError("this survey takes answers from invited respondents only")
    if len(report_ids) != n:
        raise ValueError("one report id per measurement")
    rands = [secrets.token_bytes(batch.vdaf.RAND_SIZE) for _ in range(n)]
    sharded = batch.shard_batch(vdaf_ctx(task.task_id), measurements, report_ids, rands)
    return [
        seal_report(
            task.task_id,
            report_id,
            t,
            sharded.public_shares[i],
            sharded.input_shares[0][i],
            sharded.input_shares[1][i],
            leader_config,
            helper_config,
        )
        for i, report_id in enumerate(report_ids)
    ]


def _poplar1_measurement(batch: BatchPoplar1, i: int, m: Any) -> Any:
    if isinstance(m, bytes | bytearray):
        try:
            return batch.vdaf.measurement_from_bytes(bytes(m))
        except ValueError as e:
            raise ValueError(f"report {i}: {e} ({batch.vdaf.BITS // 8} bytes)") from None
    return m


def prepare_report(
    task: Task,
    measurement: Any,
    leader_config: HpkeConfig,
    helper_config: HpkeConfig,
    report_time: int,
    *,
    batch: BatchPrio3[Any, Any] | BatchPoplar1 | None = None,
) -> Report:
    """One report; see `prepare_reports`."""
    return prepare_reports(
        task, [measurement], leader_config, helper_config, report_time, batch=batch
    )[0]

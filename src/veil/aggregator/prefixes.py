"""Poplar1 tasks on both aggregators (issue 27): what the leader and the
helper each check of an aggregation parameter, and the arithmetic of a job's
two verification rounds and of a level's release.

A Poplar1 task is collection-driven. Reports are stored as they arrive and
aggregated only when the collector names an aggregation parameter (a level
and its candidate prefixes, draft-irtf-cfrg-vdaf-20 section 8.2.3) for a
batch. Each aggregator, on its own and against its own record of the batch's
earlier parameters, refuses a parameter that

- does not decode, names more than MAX_QUERY_PREFIXES prefixes, or a level
  that is not one of the task's byte levels 7, 15, ..., 8B - 1
  (`InvalidAggParam`, `TooManyPrefixes`);
- breaks the draft's validity rule (levels increase, each prefix extends a
  prefix of the previous level queried) or queries a batch overlapping
  another queried batch (`AggParamRefused`);
- queries a (batch, level) that was already queried (`LevelCollected`).

Every level's release is charged to the aggregator's own ledger (the task's
budget is the question's, spread over its levels by
`veil.dp.heavy_hitters.HeavyHittersPlan`), so a leader cannot ask for more
levels than the budget pays for, and each count released is noised.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from veil.aggregator.errors import (
    AggParamRefused,
    InvalidAggParam,
    LevelCollected,
    TooManyPrefixes,
)
from veil.aggregator.store.records import PrefixQuery
from veil.dp.heavy_hitters import text_levels
from veil.messages import vdaf_ctx
from veil.task import AggregatorTask, Task
from veil.vdaf.batch.idpf import IdpfCache
from veil.vdaf.batch.poplar1 import BatchPoplar1
from veil.vdaf.engine import Engine, Round
from veil.vdaf.errors import AggParamError, AggParamSequenceError, CodecError
from veil.vdaf.errors import TooManyPrefixes as VdafTooManyPrefixes
from veil.vdaf.spec.poplar1 import Poplar1, Poplar1AggParam

CHECKSUM_SIZE = 32


@dataclass(frozen=True)
class PrefixVdaf:
    """A Poplar1 task's VDAF, its batched path and the levels it may be queried at."""

    vdaf: Poplar1
    batch: BatchPoplar1
    levels: frozenset[int]
    # Parameters already parsed (each job's two rounds send the same one).
    parsed: dict[bytes, Poplar1AggParam] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(task: Task) -> PrefixVdaf:
        vdaf = task.vdaf.instantiate_poplar1()
        return PrefixVdaf(vdaf, BatchPoplar1(vdaf), frozenset(text_levels(task.vdaf.max_bytes)))

    def parse(self, encoded: bytes) -> Poplar1AggParam:
        """The aggregation parameter, checked on its own (InvalidAggParam,
        TooManyPrefixes)."""
        known = self.parsed.get(encoded)
        if known is not None:
            return known
        agg_param = self._parse(encoded)
        if len(self.parsed) >= 64:
            self.parsed.clear()
        self.parsed[encoded] = agg_param
        return agg_param

    def _parse(self, encoded: bytes) -> Poplar1AggParam:
        if not encoded:
            raise InvalidAggParam(
                "a poplar1 task is collected with an aggregation parameter (agg_param: a level"
                " and its candidate prefixes); none was given"
            )
        try:
            agg_param = self.vdaf.decode_agg_param(encoded)
        except VdafTooManyPrefixes as e:
            raise TooManyPrefixes(f"aggregation parameter: {e}") from None
        except (CodecError, AggParamError) as e:
            raise InvalidAggParam(f"aggregation parameter: {e}") from None
        if agg_param.level not in self.levels:
            last = max(self.levels)
            raise InvalidAggParam(
                f"aggregation parameter: level {agg_param.level} is not a byte level of this"
                f" text task (7, 15, ..., {last}): each query extends the candidates by one byte"
            )
        if not agg_param.prefixes:
            raise InvalidAggParam("aggregation parameter: no candidate prefixes")
        return agg_param

    def sequence_check(self, agg_param: Poplar1AggParam) -> Callable[[Sequence[PrefixQuery]], None]:
        """A check of `agg_param` against a batch's earlier queries (the
        draft's is_valid), raising AggParamRefused or LevelCollected; the
        store runs it in the transaction that records the query."""

        def check(previous: Sequence[PrefixQuery]) -> None:
            ordered = sorted(previous, key=lambda q: q.level)
            if any(q.level == agg_param.level for q in ordered):
                raise LevelCollected(
                    f"the batch was already queried at level {agg_param.level}: a batch is"
                    " collected once per level"
                )
            try:
                # The rule compares with the last query only (the draft's
                # is_valid), parsed when it was recorded and likely cached.
                self.vdaf.check_valid(agg_param, [self.parse(q.agg_param) for q in ordered[-1:]])
            except AggParamSequenceError as e:
                raise AggParamRefused(
                    f"aggregation parameter breaks the rule across this batch's queries: {e}"
                ) from None

        return check


def prefix_job_id(collection_id: bytes, index: int) -> bytes:
    """The id of the leader's `index`-th aggregation job of a Poplar1
    collection: derived, so that a collection resumed after a crash sends
    the same jobs, which the helper answers from its records."""
    return hashlib.sha256(b"veil poplar1 job" + collection_id + struct.pack(">I", index)).digest()[
        :16
    ]


class LevelCaches:
    """Each aggregator's IDPF nodes of a job's reports at the last level it
    evaluated (`IdpfCache`), kept in memory between the levels of a batch so
    that the next level costs one byte of the tree instead of a walk from the
    root; and the helper's first-round evaluation of a job, kept for its
    second round. Only a speed-up: a process that restarts, or an entry
    pushed out by newer ones (at most `max_bytes` of node seeds in all),
    computes the same values from the start. Keyed by task, batch and the
    reports' ids in their order, which is what a cache is good for."""

    def __init__(self, max_bytes: int = 1 << 30, max_rounds: int = 4) -> None:
        self.max_bytes = max_bytes
        self.max_rounds = max_rounds
        self._nodes: OrderedDict[tuple[bytes, ...], IdpfCache] = OrderedDict()
        self._rounds: OrderedDict[tuple[bytes, ...], Round] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(
        task_id: bytes, start: int, agg_id: int, report_ids: Sequence[bytes]
    ) -> tuple[bytes, ...]:
        digest = hashlib.sha256(b"".join(report_ids)).digest()
        return (task_id, struct.pack(">QB", start, agg_id), digest)

    def nodes(self, key: tuple[bytes, ...], agg_param: Poplar1AggParam) -> IdpfCache | None:
        """The cached nodes if `agg_param` can start from them (a later level
        whose prefixes all extend the cached ones)."""
        with self._lock:
            cache = self._nodes.get(key)
            if cache is None or cache.level >= agg_param.level:
                return None
            self._nodes.move_to_end(key)
        known = set(cache.prefixes)
        if any(p[: cache.level + 1] not in known for p in agg_param.prefixes):
            return None
        return cache

    def keep_nodes(self, key: tuple[bytes, ...], cache: IdpfCache | None) -> None:
        if cache is None:
            return
        with self._lock:
            self._nodes[key] = cache
            self._nodes.move_to_end(key)
            total = sum(_size(c) for c in self._nodes.values())
            while total > self.max_bytes and len(self._nodes) > 1:
                _, dropped = self._nodes.popitem(last=False)
                total -= _size(dropped)

    def verify_init(
        self,
        engine: Engine,
        task: AggregatorTask,
        agg_id: int,
        start: int,
        agg_param: Poplar1AggParam,
        ids: Sequence[bytes],
        public_shares: Sequence[bytes],
        plaintexts: Sequence[bytes],
    ) -> Round:
        """The first verification step of one job's reports (aggregator
        `agg_id`), from the IDPF nodes cached for them, keeping the new ones."""
        key = self.key(task.task_id, start, agg_id, ids)
        init = engine.verify_init(
            task.verify_key,
            vdaf_ctx(task.task_id),
            agg_id,
            agg_param,
            ids,
            public_shares,
            plaintexts,
            self.nodes(key, agg_param),
        )
        self.keep_nodes(key, init.cache)
        return init

    def round(self, key: tuple[bytes, ...]) -> Round | None:
        with self._lock:
            return self._rounds.pop(key, None)

    def keep_round(self, key: tuple[bytes, ...], init: Round) -> None:
        with self._lock:
            self._rounds[key] = init
            while len(self._rounds) > self.max_rounds:
                self._rounds.popitem(last=False)


def _size(cache: IdpfCache) -> int:
    return int(cache.seeds.nbytes + cache.ctrl.nbytes)


class ShareCache:
    """Opened input shares kept in memory from one level to the next (an
    aggregator opens each report's share once per batch instead of once per
    level and round). Keyed by what the share was opened from; at most
    `max_entries`, the oldest dropped first. Only a speed-up: a miss opens
    the share again."""

    def __init__(self, max_entries: int = 50_000) -> None:
        self.max_entries = max_entries
        self._shares: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            return self._shares.get(key)

    def put(self, key: bytes, share: bytes) -> None:
        with self._lock:
            self._shares[key] = share
            while len(self._shares) > self.max_entries:
                self._shares.popitem(last=False)

"""One batched VDAF interface for the aggregators (draft-irtf-cfrg-vdaf-20,
section 5: "Verifiable Distributed Aggregation Functions"), so that the code
above it holds a VDAF as a value and never asks which one it holds.

The draft's VDAF has a number of rounds, an aggregation parameter with its
codec and a validity rule against the parameters a batch was aggregated
with before, sharding, the verification rounds (``verify_init``,
``verifier_shares_to_message``, ``verify_next``), aggregation and the
aggregate share's codec. `Engine` is that interface over a batch of reports
at once, each report's outcome apart (`Errors`: None, or why the report
failed), plus the one fact DP needs: the modulus of the field an aggregate
share, and so its noise, lives in.

Three implementations: `Prio3Engine` and `Poplar1Engine` over the batched
paths (veil.vdaf.batch, what the servers and clients run), and `SpecEngine`
over the draft-shaped classes one report at a time (veil.vdaf.spec, the
oracle the batched ones are tested against message for message). `engine_for`
is the one place that picks an implementation by the VDAF's class.

Prio3 has one round and the empty aggregation parameter (``None``); Poplar1
two rounds and a (level, prefixes) parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from veil.vdaf.batch.poplar1 import (
    BatchPoplar1,
    Poplar1OutShareBatch,
    VerifyRoundBatch,
)
from veil.vdaf.batch.prio3 import BatchPrio3, MessageBatch, OutShareBatch
from veil.vdaf.batch.prio3_shard import ShardBatch
from veil.vdaf.batch.rows import Errors
from veil.vdaf.errors import VdafError, VerifyError
from veil.vdaf.spec.poplar1 import (
    EVALUATE_SKETCH,
    REVEAL_SKETCH,
    FieldVec,
    Poplar1,
    Poplar1VerifyState,
)
from veil.vdaf.spec.prio3 import Prio3

__all__ = [
    "Engine",
    "Messages",
    "OutShares",
    "Poplar1Engine",
    "Prio3Engine",
    "Round",
    "SpecEngine",
    "engine_for",
    "helper_steps",
    "leader_steps",
]

# What the round functions exchange: each report's encoded message (None
# where the report failed) and its error.
Messages = MessageBatch


@dataclass
class Round:
    """An aggregator's state after a verification step that is not the last:
    the state to keep (the implementation's own), the encoded verifier
    shares to send (None for a failed report), each report's error, and
    what the step leaves to speed up the next query of the same reports
    (Poplar1's IDPF nodes; None otherwise)."""

    state: Any
    verifier_shares: list[bytes | None]
    errors: Errors
    cache: Any = None


@dataclass
class OutShares:
    """The output shares after the last step: each report's error (None:
    accepted) and the shares themselves, in the implementation's form."""

    errors: Errors
    shares: Any

    @property
    def accepted(self) -> list[int]:
        """The rows of the reports whose output share may be aggregated."""
        return [i for i, e in enumerate(self.errors) if e is None]


class Engine(Protocol):
    """A VDAF for two aggregators, over batches of reports.

    Pre-conditions common to the batch calls: ``nonces``, ``public_shares``
    and ``input_shares`` have one entry per report; ``verifier_shares[j]``
    is aggregator j's list, one entry per report. Each report's failure is
    its own (in ``errors``), never the batch's; ValueError only for a
    caller's mistake (lists of different lengths, a key of the wrong size).
    """

    ROUNDS: int
    SHARES: int

    def decode_agg_param(self, encoded: bytes) -> Any:
        """CodecError (or AggParamError) on a malformed parameter."""
        ...

    def encode_agg_param(self, agg_param: Any) -> bytes: ...

    def is_valid(self, agg_param: Any, previous: Sequence[Any]) -> bool:
        """The draft's rule: may a batch aggregated with each of `previous`
        (in order) be aggregated with `agg_param` too?"""
        ...

    def shard(
        self,
        ctx: bytes,
        measurements: Sequence[Any],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch: ...

    def verify_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: Any,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes],
        input_shares: Sequence[bytes],
        cache: Any = None,
    ) -> Round: ...

    def verifier_shares_to_message(
        self,
        ctx: bytes,
        agg_param: Any,
        verifier_shares: Sequence[Sequence[bytes | None]],
    ) -> Messages: ...

    def verify_next(
        self, ctx: bytes, agg_param: Any, state: Round, messages: Messages | Sequence[bytes | None]
    ) -> Round | OutShares:
        """A Round while rounds remain, the OutShares after the last. Each
        report's error is the first of the state's, the message's (given
        the Messages themselves, in the process that computed them) and
        this step's own."""
        ...

    def aggregate(self, agg_param: Any, out: OutShares, rows: Sequence[int]) -> list[int]:
        """The sum of the output shares of `rows` (accepted reports)."""
        ...

    def agg_init(self, agg_param: Any) -> list[int]: ...

    def merge(self, agg_param: Any, agg_shares: Sequence[Sequence[int]]) -> list[int]: ...

    def encode_agg_share(self, agg_param: Any, agg_share: Sequence[int]) -> bytes: ...

    def decode_agg_share(self, agg_param: Any, encoded: bytes) -> list[int]: ...

    def noise_modulus(self, agg_param: Any) -> int:
        """The modulus of the field the aggregate share (and its noise) is in."""
        ...


def _check_previous_empty(previous: Sequence[Any]) -> bool:
    # Prio3 (draft section 7.2.4): a batch is aggregated at most once.
    return len(previous) == 0


class Prio3Engine:
    """`Engine` over `BatchPrio3`: one round, the empty aggregation parameter."""

    ROUNDS = 1

    def __init__(self, batch: BatchPrio3[Any, Any]) -> None:
        self.batch = batch
        self.vdaf = batch.vdaf
        self.SHARES = batch.SHARES

    def decode_agg_param(self, encoded: bytes) -> None:
        self.vdaf.decode_agg_param(encoded)

    def encode_agg_param(self, agg_param: None) -> bytes:
        return b""

    def is_valid(self, agg_param: None, previous: Sequence[None]) -> bool:
        return _check_previous_empty(previous)

    def shard(
        self,
        ctx: bytes,
        measurements: Sequence[Any],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        return self.batch.shard_batch(ctx, measurements, nonces, rands)

    def verify_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: None,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes],
        input_shares: Sequence[bytes],
        cache: Any = None,
    ) -> Round:
        init = self.batch.verify_init_batch(
            verify_key, ctx, agg_id, nonces, public_shares, input_shares
        )
        return Round(init.state, init.verifier_shares, init.errors)

    def verifier_shares_to_message(
        self, ctx: bytes, agg_param: None, verifier_shares: Sequence[Sequence[bytes | None]]
    ) -> Messages:
        return self.batch.verifier_shares_to_message_batch(ctx, verifier_shares)

    def verify_next(
        self, ctx: bytes, agg_param: None, state: Round, messages: Messages | Sequence[bytes | None]
    ) -> OutShares:
        if isinstance(messages, MessageBatch):
            out = self.batch.verify_next_batch(ctx, state.state, messages.messages)
            errors = _first_errors(state.errors, messages.errors, out.errors)
        else:
            out = self.batch.verify_next_batch(ctx, state.state, messages)
            errors = out.errors
        return OutShares(errors, out)

    def aggregate(self, agg_param: None, out: OutShares, rows: Sequence[int]) -> list[int]:
        shares: OutShareBatch = out.shares
        return self.batch.aggregate_rows(shares, rows)

    def agg_init(self, agg_param: None) -> list[int]:
        return self.vdaf.agg_init(None)

    def merge(self, agg_param: None, agg_shares: Sequence[Sequence[int]]) -> list[int]:
        return self.vdaf.merge(None, [list(s) for s in agg_shares])

    def encode_agg_share(self, agg_param: None, agg_share: Sequence[int]) -> bytes:
        return self.vdaf.encode_agg_share(list(agg_share))

    def decode_agg_share(self, agg_param: None, encoded: bytes) -> list[int]:
        return self.vdaf.decode_agg_share(None, encoded)

    def noise_modulus(self, agg_param: None) -> int:
        return self.vdaf.field.MODULUS


class Poplar1Engine:
    """`Engine` over `BatchPoplar1`: two rounds, a (level, prefixes) parameter."""

    ROUNDS = 2

    def __init__(self, batch: BatchPoplar1) -> None:
        self.batch = batch
        self.vdaf = batch.vdaf
        self.SHARES = batch.SHARES

    def decode_agg_param(self, encoded: bytes) -> Any:
        return self.vdaf.decode_agg_param(encoded)

    def encode_agg_param(self, agg_param: Any) -> bytes:
        return self.vdaf.encode_agg_param(agg_param)

    def is_valid(self, agg_param: Any, previous: Sequence[Any]) -> bool:
        return self.vdaf.is_valid(agg_param, list(previous))

    def shard(
        self,
        ctx: bytes,
        measurements: Sequence[Any],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        return self.batch.shard_batch(ctx, measurements, nonces, rands)

    def verify_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: Any,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes],
        input_shares: Sequence[bytes],
        cache: Any = None,
    ) -> Round:
        init = self.batch.verify_init_batch(
            verify_key, ctx, agg_id, agg_param, nonces, public_shares, input_shares, cache
        )
        return Round(init.state, init.verifier_shares, init.errors, init.cache)

    def verifier_shares_to_message(
        self, ctx: bytes, agg_param: Any, verifier_shares: Sequence[Sequence[bytes | None]]
    ) -> Messages:
        return self.batch.verifier_shares_to_message_batch(ctx, agg_param, verifier_shares)

    def verify_next(
        self, ctx: bytes, agg_param: Any, state: Round, messages: Messages | Sequence[bytes | None]
    ) -> Round | OutShares:
        # (The batched Poplar1 takes the Messages themselves, errors and all.)
        step = self.batch.verify_next_batch(ctx, state.state, messages)
        if isinstance(step, VerifyRoundBatch):
            return Round(step.state, step.verifier_shares, step.errors)
        return OutShares(step.errors, step)

    def aggregate(self, agg_param: Any, out: OutShares, rows: Sequence[int]) -> list[int]:
        shares: Poplar1OutShareBatch = out.shares
        picked = set(rows)
        for i in picked:
            if shares.errors[i] is not None:
                raise ValueError(f"row {i} failed verification: it has no output share")
        errors: Errors = [
            None if i in picked else VerifyError("not aggregated")
            for i in range(len(shares.errors))
        ]
        only = Poplar1OutShareBatch(shares.level, shares.out_shares, errors)
        return list(self.batch.aggregate_batch(only))

    def agg_init(self, agg_param: Any) -> list[int]:
        return list(self.vdaf.agg_init(agg_param))

    def merge(self, agg_param: Any, agg_shares: Sequence[Sequence[int]]) -> list[int]:
        return list(self.vdaf.merge(agg_param, agg_shares))

    def encode_agg_share(self, agg_param: Any, agg_share: Sequence[int]) -> bytes:
        field = self.vdaf.idpf.current_field(agg_param.level)
        return field.encode_vec(list(agg_share))

    def decode_agg_share(self, agg_param: Any, encoded: bytes) -> list[int]:
        return list(self.vdaf.decode_agg_share(agg_param, encoded))

    def noise_modulus(self, agg_param: Any) -> int:
        return self.vdaf.idpf.current_field(agg_param.level).MODULUS


class SpecEngine:
    """`Engine` over a draft-shaped class (Prio3 or Poplar1 of veil.vdaf.spec),
    one report at a time: the oracle of the batched engines. A report that
    does not decode fails with CodecError, one the VDAF rejects with its
    VerifyError, as in the batched paths."""

    def __init__(self, vdaf: Prio3[Any, Any] | Poplar1) -> None:
        self.vdaf: Any = vdaf
        self.ROUNDS = vdaf.ROUNDS
        self.SHARES = vdaf.SHARES

    def decode_agg_param(self, encoded: bytes) -> Any:
        return self.vdaf.decode_agg_param(encoded)

    def encode_agg_param(self, agg_param: Any) -> bytes:
        return bytes(self.vdaf.encode_agg_param(agg_param))

    def is_valid(self, agg_param: Any, previous: Sequence[Any]) -> bool:
        if isinstance(self.vdaf, Prio3):
            return _check_previous_empty(previous)
        return bool(self.vdaf.is_valid(agg_param, list(previous)))

    def shard(
        self,
        ctx: bytes,
        measurements: Sequence[Any],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        vdaf = self.vdaf
        public: list[bytes] = []
        inputs: list[list[bytes]] = [[] for _ in range(self.SHARES)]
        for m, nonce, rand in zip(measurements, nonces, rands, strict=True):
            public_share, shares = vdaf.shard(ctx, m, nonce, rand)
            public.append(vdaf.encode_public_share(public_share))
            for j, share in enumerate(shares):
                inputs[j].append(vdaf.encode_input_share(share))
        return ShardBatch(public, inputs)

    def verify_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: Any,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes],
        input_shares: Sequence[bytes],
        cache: Any = None,
    ) -> Round:
        vdaf = self.vdaf
        states: list[Any] = []
        shares: list[bytes | None] = []
        errors: Errors = []
        for nonce, public, share in zip(nonces, public_shares, input_shares, strict=True):
            try:
                state, verifier_share = vdaf.verify_init(
                    verify_key,
                    ctx,
                    agg_id,
                    agg_param,
                    nonce,
                    vdaf.decode_public_share(public),
                    vdaf.decode_input_share(agg_id, share),
                )
            except VdafError as e:
                states.append(None)
                shares.append(None)
                errors.append(e)
                continue
            states.append(state)
            shares.append(vdaf.encode_verifier_share(verifier_share))
            errors.append(None)
        # The state: how many steps were taken, and each report's.
        return Round((0, states), shares, errors)

    def verifier_shares_to_message(
        self, ctx: bytes, agg_param: Any, verifier_shares: Sequence[Sequence[bytes | None]]
    ) -> Messages:
        vdaf = self.vdaf
        messages: list[bytes | None] = []
        errors: Errors = []
        for shares in zip(*verifier_shares, strict=True):
            try:
                decoded = [self._decode_verifier_share(agg_param, s) for s in shares]
                message = vdaf.verifier_shares_to_message(ctx, agg_param, decoded)
            except VdafError as e:
                messages.append(None)
                errors.append(e)
                continue
            messages.append(bytes(vdaf.encode_verifier_message(message)))
            errors.append(None)
        return MessageBatch(messages, errors)

    def _decode_verifier_share(self, agg_param: Any, encoded: bytes | None) -> Any:
        if encoded is None:
            raise VerifyError("an aggregator rejected the report")
        vdaf = self.vdaf
        if isinstance(vdaf, Prio3):
            # Prio3's codec reads its sizes from the VDAF, not the state.
            return vdaf.decode_verifier_share(None, encoded)  # type: ignore[arg-type]
        # Poplar1's reads the round from the state; here, as the batched
        # path does, from the share's size (three elements, then one).
        field = vdaf.idpf.current_field(agg_param.level)
        step = EVALUATE_SKETCH if len(encoded) == 3 * field.ENCODED_SIZE else REVEAL_SKETCH
        state = Poplar1VerifyState(step, agg_param.level, FieldVec(field, []))
        return vdaf.decode_verifier_share(state, encoded)

    def verify_next(
        self, ctx: bytes, agg_param: Any, state: Round, messages: Messages | Sequence[bytes | None]
    ) -> Round | OutShares:
        vdaf = self.vdaf
        done, states = state.state
        final = done + 1 == self.ROUNDS
        kept: list[Any] = []
        shares: list[bytes | None] = []
        errors: Errors = list(state.errors)
        if isinstance(messages, MessageBatch):
            errors = _first_errors(errors, messages.errors)
            messages = messages.messages
        for i, (s, m) in enumerate(zip(states, messages, strict=True)):
            step: Any = None
            if errors[i] is None:
                try:
                    if m is None:
                        raise VerifyError("the report was rejected")
                    step = vdaf.verify_next(ctx, s, vdaf.decode_verifier_message(s, m))
                except VdafError as e:
                    errors[i] = e
            if step is None:
                kept.append(None)
                shares.append(None)
            elif final:
                kept.append(list(step))
            else:
                kept.append(step[0])
                shares.append(vdaf.encode_verifier_share(step[1]))
        if final:
            return OutShares(errors, kept)
        return Round((done + 1, kept), shares, errors)

    def aggregate(self, agg_param: Any, out: OutShares, rows: Sequence[int]) -> list[int]:
        vdaf = self.vdaf
        agg = vdaf.agg_init(agg_param)
        for i in rows:
            share = out.shares[i]
            if out.errors[i] is not None or share is None:
                raise ValueError(f"row {i} failed verification: it has no output share")
            agg = vdaf.agg_update(agg_param, agg, share)
        return list(agg)

    def agg_init(self, agg_param: Any) -> list[int]:
        return list(self.vdaf.agg_init(agg_param))

    def merge(self, agg_param: Any, agg_shares: Sequence[Sequence[int]]) -> list[int]:
        return list(self.vdaf.merge(agg_param, [list(s) for s in agg_shares]))

    def encode_agg_share(self, agg_param: Any, agg_share: Sequence[int]) -> bytes:
        if isinstance(self.vdaf, Prio3):
            return self.vdaf.encode_agg_share(list(agg_share))
        field = self.vdaf.idpf.current_field(agg_param.level)
        return bytes(field.encode_vec(list(agg_share)))

    def decode_agg_share(self, agg_param: Any, encoded: bytes) -> list[int]:
        return list(self.vdaf.decode_agg_share(agg_param, encoded))

    def noise_modulus(self, agg_param: Any) -> int:
        if isinstance(self.vdaf, Prio3):
            return int(self.vdaf.field.MODULUS)
        return int(self.vdaf.idpf.current_field(agg_param.level).MODULUS)


# -- the rounds between two aggregators (draft section 5.7's ping-pong) ------
#
# The leader sends its first verifier shares; the helper combines them with
# its own into the round's messages and takes its next step, answering with
# the messages and, while rounds remain, its next verifier shares; the
# leader takes its next step from the messages and, while rounds remain,
# combines its next shares with the helper's into the next messages. veil's
# wire has the leader finish a two-round VDAF by sending its second shares,
# from which the helper computes the same last messages itself.


def helper_steps(
    engine: Engine,
    ctx: bytes,
    agg_param: Any,
    init: Round,
    leader_shares: Sequence[Sequence[bytes | None]],
) -> tuple[Round | OutShares, Messages]:
    """The helper's rounds 1 to len(leader_shares) from its first step
    `init`, given the leader's verifier shares of each of those rounds: the
    last step (a Round with the helper's next shares, or the output shares
    after the VDAF's last round) and the last round's messages."""
    if not 0 < len(leader_shares) <= engine.ROUNDS:
        raise ValueError(f"between 1 and {engine.ROUNDS} rounds of the leader's shares")
    step: Round | OutShares = init
    messages = MessageBatch([], [])
    for shares in leader_shares:
        if not isinstance(step, Round):
            raise ValueError("more rounds of the leader's shares than the VDAF has")
        messages = engine.verifier_shares_to_message(ctx, agg_param, [shares, step.verifier_shares])
        step = engine.verify_next(ctx, agg_param, step, messages)
    return step, messages


def leader_steps(
    engine: Engine,
    ctx: bytes,
    agg_param: Any,
    init: Round,
    messages: Sequence[bytes | None],
    helper_shares: Sequence[bytes | None] | None = None,
) -> tuple[OutShares, list[list[bytes | None]]]:
    """The leader's steps once the helper answered the first round with its
    `messages` (None: the helper rejected the report) and, for a VDAF of two
    rounds, its second verifier shares: the leader's output shares, and its
    verifier shares of the rounds after the first (what the helper finishes
    with)."""
    step = engine.verify_next(ctx, agg_param, init, messages)
    sent: list[list[bytes | None]] = []
    while isinstance(step, Round):
        if helper_shares is None:
            raise ValueError("the helper's next verifier shares are needed for this VDAF")
        sent.append(list(step.verifier_shares))
        last = engine.verifier_shares_to_message(
            ctx, agg_param, [step.verifier_shares, helper_shares]
        )
        step = engine.verify_next(ctx, agg_param, step, last)
        helper_shares = None
    return step, sent


def _first_errors(*columns: Errors) -> Errors:
    """Each report's first error among the columns (state, message, step)."""
    return [next((e for e in row if e is not None), None) for row in zip(*columns, strict=True)]


def engine_for(vdaf: Prio3[Any, Any] | Poplar1) -> Engine:
    """The batched engine of `vdaf` (the one place that looks at its class)."""
    if isinstance(vdaf, Poplar1):
        return Poplar1Engine(BatchPoplar1(vdaf))
    return Prio3Engine(BatchPrio3(vdaf))

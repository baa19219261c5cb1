"""Poplar1 (draft-irtf-cfrg-vdaf-20, Section 8) over many reports at once.

``BatchPoplar1`` wraps a scalar ``Poplar1`` and runs the same algorithms
with one NumPy row per report: ``shard_batch`` (clients, simulations),
``verify_init_batch``, ``verifier_shares_to_message_batch``,
``verify_next_batch`` (twice: Poplar1 verifies in two rounds) and
``aggregate_batch``. It agrees with the scalar path byte for byte, report
by report; messages cross the batch boundary as the scalar encodings.

Where the time goes, and what is done about it:

- The IDPF walks a tree of AES-hashed seeds. Every report has its own AES
  key (derived from its nonce), so AES runs per report, through
  ``cryptography`` (OpenSSL): one call hashes all of a report's nodes at a
  depth, and everything between calls (the correlation-robust hash's
  sigma and xor, control bits, corrections, child selection) is one NumPy
  operation over every report and node.
- The candidate prefixes of one aggregation parameter share ancestors, and
  are the same for every report: each node of their prefix tree is
  computed once per report, not once per prefix.
- Across levels, ``IdpfCache`` keeps each report's nodes at the last level
  evaluated (and its two AES contexts): the draft's rule makes every new
  prefix extend a cached one, so the next level costs one step of the
  tree, not a walk from the root.
- Between the two AES passes of a depth, the per-node work is compiled
  loops (``veil.vdaf.batch._idpf_kernels``); the walk runs over
  sub-batches of reports (``chunk_nodes``) so memory stays bounded with
  thousands of candidates.
- The sketch is Field64 arithmetic over ``(reports, prefixes)`` arrays
  (compiled kernels); the leaf level's Field255 uses Python ints in NumPy
  object arrays (one level of many).

A report that fails (bad encoding, a rejected sketch) never raises for
the batch: each result carries ``errors``, one ``VdafError`` or ``None``
per report, and ``ok``; later steps pass earlier failures through. Misuse
that is wrong for every report (a malformed aggregation parameter, a bad
verify key or ``agg_id``, mismatched lengths) raises.

One level, both aggregators in one process::

    batch = BatchPoplar1(Poplar1(128))
    sharded = batch.shard_batch(ctx, measurements, nonces, rands)
    caches = [None, None]
    agg_param = Poplar1AggParam(0, ((False,), (True,)))
    inits = [
        batch.verify_init_batch(key, ctx, j, agg_param, nonces,
                                sharded.public_shares, sharded.input_shares[j], caches[j])
        for j in (0, 1)
    ]
    caches = [init.cache for init in inits]  # for the next level
    msgs = batch.verifier_shares_to_message_batch(
        ctx, agg_param, [init.verifier_shares for init in inits])
    # (In a deployment each aggregator passes the encoded messages it got,
    # msgs.messages; in one process the MessageBatch keeps its errors too.)
    seconds = [batch.verify_next_batch(ctx, init.state, msgs) for init in inits]
    finals = batch.verifier_shares_to_message_batch(
        ctx, agg_param, [s.verifier_shares for s in seconds])
    outs = [batch.verify_next_batch(ctx, s.state, finals) for s in seconds]
    counts = vdaf.unshard(agg_param, [batch.aggregate_batch(o) for o in outs], n)
"""

from __future__ import annotations

import importlib
import operator
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from veil.vdaf.batch.field import Arr, VecField64
from veil.vdaf.batch.kernels import _cache_lock
from veil.vdaf.batch.prio3 import MessageBatch, ShardBatch
from veil.vdaf.batch.xof import expand_rows, turboshake_rows, xof_rows
from veil.vdaf.errors import AggParamSequenceError, CodecError, VdafError, VerifyError
from veil.vdaf.spec.field import Field, Field64, Field255
from veil.vdaf.spec.idpf import DST_CONVERT, DST_EXTEND, CorrectionWord, FixedKeys
from veil.vdaf.spec.poplar1 import (
    EVALUATE_SKETCH,
    REVEAL_SKETCH,
    USAGE_CORR_INNER,
    USAGE_CORR_LEAF,
    USAGE_SHARD_RAND,
    USAGE_VERIFY_RAND,
    FieldVec,
    Poplar1,
    Poplar1AggParam,
    Prefix,
)

Errors = list[VdafError | None]
# A report's AES-128-ECB under its fixed key: ``update_into(data, out)``.
Encrypt = Callable[[Any, Any], int]

_compiled: Any = None


def _walk_kernels() -> Any:
    """``veil.vdaf.batch._idpf_kernels``, compiled (or loaded from numba's
    cache) on first use, under the kernels' cache lock."""
    global _compiled
    if _compiled is None:
        with _cache_lock():
            _compiled = importlib.import_module("veil.vdaf.batch._idpf_kernels")
    return _compiled


_P64 = np.uint64(Field64.MODULUS)
_P255 = Field255.MODULUS
_MASK255 = (1 << 255) - 1
_ONE = np.uint64(1)
_LITTLE = sys.byteorder == "little"


def _ok(errors: Errors) -> Arr:
    return np.array([e is None for e in errors], dtype=bool)


def _flag(errors: Errors, mask: Any, error: VdafError) -> None:
    for i in np.flatnonzero(mask):
        if errors[i] is None:
            errors[i] = error


def _rows(values: Sequence[bytes | None], length: int, what: str, errors: Errors) -> Arr:
    """A ``(len(values), length)`` byte array; a row of another length (or
    None) is zero and recorded as a ``CodecError``."""
    if all(v is not None and len(v) == length for v in values):
        joined = b"".join(v for v in values if v is not None)
        return np.frombuffer(joined, dtype=np.uint8).reshape(len(values), length)
    blank = bytes(length)
    parts = []
    for i, v in enumerate(values):
        if v is None or len(v) != length:
            if errors[i] is None:
                got = "nothing" if v is None else f"{len(v)} bytes"
                errors[i] = CodecError(f"{what} must be {length} bytes, got {got}")
            parts.append(blank)
        else:
            parts.append(v)
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(len(values), length)


def _u64(raw: Arr) -> Arr:
    """Little-endian 8-byte groups of the last axis as native ``uint64``."""
    raw = np.ascontiguousarray(raw)
    return raw.view("<u8").astype(np.uint64)


def _bytes_of(a: Arr) -> bytes:
    """The little-endian bytes of a ``uint64`` array, in C order."""
    return np.ascontiguousarray(a, dtype="<u8").tobytes()


def _ints255(raw: Arr) -> Arr:
    """32-byte little-endian groups of the last axis as Python ints (an
    object array of one fewer byte axis, 32 times shorter)."""
    shape = (*raw.shape[:-1], raw.shape[-1] // 32)
    flat = np.ascontiguousarray(raw).tobytes()
    values = np.empty(len(flat) // 32, dtype=object)
    values[:] = [int.from_bytes(flat[i : i + 32], "little") for i in range(0, len(flat), 32)]
    return values.reshape(shape)


def _encode255(values: Arr) -> bytes:
    return b"".join(int(v).to_bytes(32, "little") for v in values.reshape(-1))


# -- the level's field, as arrays -------------------------------------------


class _Inner:
    """Field64 on ``uint64`` arrays (the compiled kernels)."""

    field: type[Field] = Field64
    SIZE = 8

    @staticmethod
    def decode(raw: Arr) -> tuple[Arr, Arr]:
        values = _u64(raw)
        return values, values < _P64

    @staticmethod
    def encode(values: Arr) -> bytes:
        return _bytes_of(values)

    @staticmethod
    def zeros(shape: tuple[int, ...]) -> Arr:
        return np.zeros(shape, dtype=np.uint64)

    add = staticmethod(VecField64.add)
    sub = staticmethod(VecField64.sub)
    mul = staticmethod(VecField64.mul)
    neg = staticmethod(VecField64.neg)

    @staticmethod
    def dot(a: Arr, b: Arr) -> Arr:
        return VecField64.dot(a, b, axis=-1)

    @staticmethod
    def from_int(value: int) -> Any:
        return np.uint64(value)

    @staticmethod
    def to_ints(values: Arr) -> list[int]:
        return [int(v) for v in values]


class _Leaf:
    """Field255 on NumPy object arrays of Python ints."""

    field: type[Field] = Field255
    SIZE = 32

    @staticmethod
    def decode(raw: Arr) -> tuple[Arr, Arr]:
        values = _ints255(raw)
        return values, values < _P255

    @staticmethod
    def encode(values: Arr) -> bytes:
        return _encode255(values)

    @staticmethod
    def zeros(shape: tuple[int, ...]) -> Arr:
        out = np.empty(shape, dtype=object)
        out.fill(0)
        return out

    @staticmethod
    def add(a: Arr, b: Arr) -> Arr:
        return (a + b) % _P255

    @staticmethod
    def sub(a: Arr, b: Arr) -> Arr:
        return (a - b) % _P255

    @staticmethod
    def mul(a: Arr, b: Arr) -> Arr:
        return (a * b) % _P255

    @staticmethod
    def neg(a: Arr) -> Arr:
        return (-a) % _P255

    @staticmethod
    def dot(a: Arr, b: Arr) -> Arr:
        return np.asarray((a * b).sum(axis=-1) % _P255)

    @staticmethod
    def from_int(value: int) -> Any:
        return value

    @staticmethod
    def to_ints(values: Arr) -> list[int]:
        return [int(v) for v in values]


_Arith = type[_Inner] | type[_Leaf]


# -- the IDPF over many reports ----------------------------------------------


def _aes_rows(encrypts: Sequence[Encrypt], blocks: Arr) -> Arr:
    """AES-128 of each report's blocks under its own key: ``blocks`` is
    ``(reports, ..., 2)`` ``uint64`` (two words per 16-byte block); the
    result has its shape. One call per report, on all of its blocks, each
    writing into its row of one buffer; the loop over reports runs in C
    (``map``), the calls are OpenSSL's."""
    rows = blocks.shape[0]
    if not _LITTLE:
        blocks = blocks.astype("<u8")
    blocks = np.ascontiguousarray(blocks)
    width = blocks.nbytes // rows if rows else 0
    # update_into wants room for a block beyond its input: the next row's
    # (written after), and 16 spare bytes at the end.
    out = np.empty(blocks.nbytes + 16, dtype=np.uint8)
    source = blocks.data.cast("B")
    target = out.data
    starts = range(0, rows * width, width)
    ins = map(source.__getitem__, map(slice, starts, range(width, rows * width + 1, width)))
    outs = map(target.__getitem__, map(slice, starts, range(width + 16, rows * width + 17, width)))
    deque(map(operator.call, encrypts, ins, outs), maxlen=0)
    hashed = out[: blocks.nbytes].view("<u8").reshape(blocks.shape)
    return hashed if _LITTLE else hashed.astype(np.uint64)


def _hash_rows(encrypts: Sequence[Encrypt], seeds: Arr, count: int) -> Arr:
    """Blocks 0 to ``count - 1`` of XofFixedKeyAes128's stream for each
    seed (``(reports, nodes, 2)`` ``uint64``): ``AES(s) xor s`` with ``s =
    sigma(seed xor le128(i))``; ``(reports, nodes, count, 2)``."""
    lo, hi = seeds[..., 0], seeds[..., 1]
    sigma = np.empty((*seeds.shape[:-1], count, 2), dtype=np.uint64)
    for i in range(count):
        sigma[..., i, 0] = hi
        sigma[..., i, 1] = hi ^ lo ^ np.uint64(i)
    return _aes_rows(encrypts, sigma) ^ sigma


def _tree(level: int, prefixes: Sequence[Prefix], start: int, roots: Sequence[Prefix]) -> list[Any]:
    """The prefix tree between depth ``start`` (below the nodes ``roots``,
    of length ``start``) and ``level``: for each depth d in ``[start,
    level]``, the sorted nodes of length ``d + 1`` and, for each, the index
    of its parent among the previous depth's nodes and its last bit. Built
    from the prefixes up, each depth from the one below (which is never
    larger), so that a deep level of many prefixes costs little."""
    layers = [sorted(set(prefixes))]
    for _ in range(level - 1, start - 1, -1):
        layers.append(sorted({p[:-1] for p in layers[-1]}))
    layers.reverse()
    steps = []
    index = {p: i for i, p in enumerate(roots)}
    for nodes in layers:
        parent = np.array([index[p[:-1]] for p in nodes], dtype=np.intp)
        bit = np.array([int(p[-1]) for p in nodes], dtype=np.intp)
        steps.append((nodes, parent, bit))
        index = {p: i for i, p in enumerate(nodes)}
    return steps


@dataclass
class IdpfCache:
    """One aggregator's IDPF nodes of a batch, kept from one level to the
    next: the level last evaluated and its prefixes (``level``,
    ``prefixes``: what the next level must extend), and the nodes of one
    depth at or above it (``node_level``, ``node_prefixes``; ``seeds``
    ``(reports, nodes, 2)``, ``ctrl`` ``(reports, nodes)``) with each
    report's two fixed-key AES contexts (extend, convert). The nodes kept
    are those of the deepest depth with at most ``BatchPoplar1.cache_nodes``
    of them, so that a level of many candidates (every byte value after
    each survivor) does not hold them all per report. Held in memory
    between the levels of one collection; only good for the same reports
    in the same order (``nonces``) and the same aggregator. It checks that
    the next level extends ``prefixes``, but the draft's rule across the
    parameters used is the caller's (``Poplar1.check_valid``)."""

    agg_id: int
    level: int
    prefixes: tuple[Prefix, ...]
    node_level: int
    node_prefixes: tuple[Prefix, ...]
    nonces: bytes
    seeds: Arr
    ctrl: Arr
    extend: list[Encrypt]
    convert: list[Encrypt]


@dataclass
class _Decoded:
    """One aggregator's reports, decoded: the IDPF's correction words by
    level and its key; the correlated randomness."""

    nonces: Arr  # (R, 16) uint8
    ctrl_cw: Arr  # (R, BITS, 2) bool
    seed_cw: Arr  # (R, BITS, 2) uint64
    w_inner: Arr  # (R, BITS - 1, 2) uint64
    w_leaf: Arr  # (R, 2) object
    keys: Arr  # (R, 2) uint64
    corr_seeds: Arr  # (R, 32) uint8
    corr_inner: Arr  # (R, 2 * (BITS - 1)) uint64
    corr_leaf: Arr  # (R, 2) object
    errors: Errors

    def part(self, rows: slice) -> _Decoded:
        """The same reports' rows ``rows`` (errors stay with the whole)."""
        return _Decoded(
            self.nonces[rows],
            self.ctrl_cw[rows],
            self.seed_cw[rows],
            self.w_inner[rows],
            self.w_leaf[rows],
            self.keys[rows],
            self.corr_seeds[rows],
            self.corr_inner[rows],
            self.corr_leaf[rows],
            self.errors,
        )


@dataclass
class BatchVerifyState:
    """An aggregator's state for a batch: the step, the level, the sketch
    memory (``a_share``, ``b_share``: A and B of each report) and the output
    shares ``(reports, prefixes)`` in the level's field."""

    step: bytes
    level: int
    agg_id: int
    a_share: Arr
    b_share: Arr
    out_shares: Arr
    errors: Errors

    @property
    def ok(self) -> Arr:
        return _ok(self.errors)

    def __len__(self) -> int:
        return len(self.errors)


@dataclass
class VerifyRoundBatch:
    """A round's result: the state to keep, the encoded verifier shares to
    send (``None`` for failed reports), and after ``verify_init_batch`` the
    IDPF cache for the next level."""

    state: BatchVerifyState
    verifier_shares: list[bytes | None]
    cache: IdpfCache | None = None

    @property
    def errors(self) -> Errors:
        return self.state.errors

    @property
    def ok(self) -> Arr:
        return self.state.ok


@dataclass
class Poplar1OutShareBatch:
    """Output shares ``(reports, prefixes)`` of the level's field; rows of
    failed reports are excluded by ``ok``."""

    level: int
    out_shares: Arr
    errors: Errors

    @property
    def ok(self) -> Arr:
        return _ok(self.errors)


class BatchPoplar1:
    """The batched path of one ``Poplar1`` instance."""

    # Nodes (reports x nodes of one depth) per sub-batch of the IDPF walk:
    # about 40 bytes each across its arrays, so some tens of MiB however
    # many reports and candidates are passed.
    chunk_nodes = 1 << 18
    # Nodes per report an IdpfCache keeps (16 bytes and a bit each).
    cache_nodes = 1 << 12

    def __init__(self, vdaf: Poplar1) -> None:
        self.vdaf = vdaf
        self.idpf = vdaf.idpf
        self.BITS = vdaf.BITS
        self.SHARES = vdaf.SHARES

    def _arith(self, level: int) -> _Arith:
        return _Inner if level < self.BITS - 1 else _Leaf

    # -- fixed AES keys ----------------------------------------------------

    def _fixed_keys(self, dst: bytes, nonces: Arr) -> list[Encrypt]:
        """Each report's AES-128 encryption under its fixed key for ``dst``
        (TurboSHAKE128, domain byte 2, of the tag and the nonce)."""
        rows = nonces.shape[0]
        prefix = np.frombuffer(len(dst).to_bytes(2, "little") + dst, dtype=np.uint8)
        messages = np.concatenate([np.broadcast_to(prefix, (rows, len(prefix))), nonces], axis=1)
        keys = turboshake_rows(messages, 16, domain=2)
        ecb = modes.ECB()
        return [
            Cipher(algorithms.AES(keys[r].tobytes()), ecb).encryptor().update_into
            for r in range(rows)
        ]

    def _leaf_xof(self, dst: bytes, seeds: Arr, nonces: Arr, out_len: int) -> Arr:
        """XofTurboShake128 with 16-byte seeds (the IDPF's leaf level) for
        each (report, node): ``seeds`` ``(R, N, 2)`` ``uint64``; bytes
        ``(R, N, out_len)``."""
        rows, nodes = seeds.shape[:2]
        head = np.frombuffer(len(dst).to_bytes(2, "little") + dst + bytes([16]), dtype=np.uint8)
        seed_bytes = np.frombuffer(_bytes_of(seeds), dtype=np.uint8).reshape(rows, nodes, 16)
        messages = np.concatenate(
            [
                np.broadcast_to(head, (rows, nodes, len(head))),
                seed_bytes,
                np.broadcast_to(nonces[:, None, :], (rows, nodes, nonces.shape[1])),
            ],
            axis=2,
        ).reshape(rows * nodes, -1)
        return turboshake_rows(messages, out_len).reshape(rows, nodes, out_len)

    # -- decoding ----------------------------------------------------------

    def _decode(
        self,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes | None],
        input_shares: Sequence[bytes | None],
    ) -> _Decoded:
        rows = len(nonces)
        bits = self.BITS
        errors: Errors = [None] * rows
        nonce_rows = _rows(nonces, self.vdaf.NONCE_SIZE, "nonce", errors)
        public = _rows(public_shares, self.vdaf.public_share_size(), "public share", errors)
        packed_len = (2 * bits + 7) // 8
        ctrl = np.unpackbits(public[:, :packed_len], axis=1, bitorder="little")
        _flag(errors, ctrl[:, 2 * bits :].any(axis=1), CodecError("control bits: padding set"))
        ctrl_cw = ctrl[:, : 2 * bits].reshape(rows, bits, 2).astype(bool)
        offset = packed_len
        seed_cw = _u64(public[:, offset : offset + 16 * bits]).reshape(rows, bits, 2)
        offset += 16 * bits
        w_inner, ok = _Inner.decode(public[:, offset : offset + 16 * (bits - 1)])
        _flag(errors, ~ok.all(axis=1), CodecError("public share: Field64 element not reduced"))
        w_inner = w_inner.reshape(rows, bits - 1, 2)
        offset += 16 * (bits - 1)
        w_leaf, ok = _Leaf.decode(public[:, offset:])
        _flag(errors, ~ok.all(axis=1), CodecError("public share: Field255 element not reduced"))

        shares = _rows(input_shares, self.vdaf.input_share_size(agg_id), "input share", errors)
        keys = _u64(shares[:, :16])
        corr_seeds = shares[:, 16:48]
        corr_inner, ok = _Inner.decode(shares[:, 48 : 48 + 16 * (bits - 1)])
        _flag(errors, ~ok.all(axis=1), CodecError("input share: Field64 element not reduced"))
        corr_leaf, ok = _Leaf.decode(shares[:, 48 + 16 * (bits - 1) :])
        _flag(errors, ~ok.all(axis=1), CodecError("input share: Field255 element not reduced"))
        return _Decoded(
            nonce_rows,
            ctrl_cw,
            seed_cw,
            w_inner,
            w_leaf,
            keys,
            corr_seeds,
            corr_inner,
            corr_leaf,
            errors,
        )

    # -- the IDPF walk -----------------------------------------------------

    def _eval(
        self,
        agg_id: int,
        level: int,
        prefixes: tuple[Prefix, ...],
        ctx: bytes,
        d: _Decoded,
        cache: IdpfCache | None,
    ) -> tuple[Arr, Arr, IdpfCache]:
        """Each report's share of the value at each prefix: data and auth,
        ``(reports, prefixes)`` each, and the cache for the next level. The
        walk runs over sub-batches of reports so that the arrays of one
        depth hold at most about ``chunk_nodes`` nodes."""
        rows = d.nonces.shape[0]
        nonce_bytes = d.nonces.tobytes()
        if cache is not None:
            if cache.agg_id != agg_id or cache.nonces != nonce_bytes:
                raise ValueError("the IDPF cache is of other reports or another aggregator")
            if level <= cache.level:
                raise AggParamSequenceError(
                    f"level {level} does not follow level {cache.level}: levels must increase"
                )
            known = set(cache.prefixes)
            if any(p[: cache.level + 1] not in known for p in prefixes):
                raise AggParamSequenceError(
                    f"a candidate prefix does not extend any prefix of level {cache.level}"
                )
            start, roots = cache.node_level + 1, list(cache.node_prefixes)
            seeds, ctrl = cache.seeds, cache.ctrl
            extend, convert = cache.extend, cache.convert
        else:
            start, roots = 0, [()]
            seeds = d.keys.reshape(rows, 1, 2)
            ctrl = np.full((rows, 1), bool(agg_id))
            extend = self._fixed_keys(DST_EXTEND + ctx, d.nonces)
            convert = self._fixed_keys(DST_CONVERT + ctx, d.nonces)
        steps = _tree(level, prefixes, start, roots)
        # The depth whose nodes the next level starts from: the deepest
        # with few enough nodes (else the depth already cached).
        keep = start - 1
        for depth, (nodes, _, _) in zip(range(start, level + 1), steps, strict=True):
            if len(nodes) <= self.cache_nodes:
                keep = depth
        widest = max([len(roots), *(len(nodes) for nodes, _, _ in steps)])
        step_rows = max(1, self.chunk_nodes // widest)
        arith = self._arith(level)
        data = arith.zeros((rows, len(prefixes)))
        auth = arith.zeros((rows, len(prefixes)))
        kept_seeds, kept_ctrl = seeds, ctrl
        if keep >= start:
            kept_seeds = np.zeros((rows, len(steps[keep - start][0]), 2), dtype=np.uint64)
            kept_ctrl = np.zeros((rows, len(steps[keep - start][0])), dtype=bool)
        for first in range(0, rows, step_rows):
            part = slice(first, min(rows, first + step_rows))
            dp = d.part(part)
            node_seeds, node_ctrl = seeds[part], ctrl[part]
            y: Arr | None = None
            for depth, (_, parent, bit) in zip(range(start, level + 1), steps, strict=True):
                node_seeds, node_ctrl, y = self._step(
                    depth,
                    depth == level,
                    node_seeds,
                    node_ctrl,
                    parent,
                    bit,
                    dp,
                    ctx,
                    extend[part],
                    convert[part],
                )
                if depth == keep:
                    kept_seeds[part], kept_ctrl[part] = node_seeds, node_ctrl
            assert y is not None
            if agg_id == 1:
                y = arith.neg(y)
            data[part], auth[part] = y[..., 0], y[..., 1]
        node_prefixes = tuple(steps[keep - start][0]) if keep >= start else tuple(roots)
        new_cache = IdpfCache(
            agg_id,
            level,
            prefixes,
            keep,
            node_prefixes,
            nonce_bytes,
            kept_seeds,
            kept_ctrl,
            extend,
            convert,
        )
        return data, auth, new_cache

    def _step(
        self,
        depth: int,
        last: bool,
        seeds: Arr,
        ctrl: Arr,
        parent: Arr,
        bit: Arr,
        d: _Decoded,
        ctx: bytes,
        extend: list[Encrypt],
        convert: list[Encrypt],
    ) -> tuple[Arr, Arr, Arr | None]:
        """One depth of the tree: the children ``(parent, bit)`` of the
        nodes ``(seeds, ctrl)`` at ``depth - 1``; their seeds, control bits
        and, at the last depth, their value shares ``(R, N, 2)``."""
        if depth == self.BITS - 1:
            return self._leaf_step(last, seeds, ctrl, parent, bit, d, ctx)
        k = _walk_kernels()
        rows, nodes = seeds.shape[0], len(parent)
        seeds = np.ascontiguousarray(seeds)
        ctrl = np.ascontiguousarray(ctrl)
        sigma = np.empty((rows, seeds.shape[1], 2, 2), dtype=np.uint64)
        k.sigma_blocks(seeds, 2, sigma)
        hashed = _aes_rows(extend, sigma)
        count = 2 if last else 1
        child_ctrl = np.empty((rows, nodes), dtype=bool)
        conv_sigma = np.empty((rows, nodes, count, 2), dtype=np.uint64)
        k.extend_children(
            hashed,
            sigma,
            ctrl,
            np.ascontiguousarray(d.seed_cw[:, depth]),
            np.ascontiguousarray(d.ctrl_cw[:, depth]),
            parent,
            bit,
            count,
            child_ctrl,
            conv_sigma,
        )
        hashed = _aes_rows(convert, conv_sigma)
        next_seeds = np.empty((rows, nodes, 2), dtype=np.uint64)
        values = np.zeros((rows, nodes, 2), dtype=np.uint64)
        bad = np.zeros((rows, nodes), dtype=bool)
        k.convert_nodes(
            hashed,
            conv_sigma,
            child_ctrl,
            np.ascontiguousarray(d.w_inner[:, depth]),
            last,
            next_seeds,
            values,
            bad,
        )
        if not last:
            return next_seeds, child_ctrl, None
        if bad.any():
            self._redo(values, bad, depth, seeds, ctrl, parent, bit, d, ctx)
        return next_seeds, child_ctrl, values

    def _leaf_step(
        self,
        last: bool,
        seeds: Arr,
        ctrl: Arr,
        parent: Arr,
        bit: Arr,
        d: _Decoded,
        ctx: bytes,
    ) -> tuple[Arr, Arr, Arr | None]:
        """``_step`` at the leaf level, where both hashes are
        XofTurboShake128 and the values Field255 (one level of many: NumPy
        and Python ints)."""
        depth = self.BITS - 1
        rows = seeds.shape[0]
        raw = self._leaf_xof(DST_EXTEND + ctx, seeds, d.nonces, 32)
        s = _u64(raw).reshape(rows, seeds.shape[1], 2, 2)
        t = (s[..., 0] & _ONE).astype(bool)
        s[..., 0] &= ~_ONE
        # The correction of a node whose control bit is set.
        on = ctrl[:, :, None, None]
        s ^= np.where(on, d.seed_cw[:, None, None, depth, :], np.uint64(0))
        t ^= ctrl[:, :, None] & d.ctrl_cw[:, None, depth, :]
        child_seeds = s[:, parent, bit]
        child_ctrl = t[:, parent, bit]
        raw = self._leaf_xof(DST_CONVERT + ctx, child_seeds, d.nonces, 16 + 64)
        next_seeds = _u64(raw[..., :16])
        if not last:
            return next_seeds, child_ctrl, None
        values = _ints255(raw[..., 16:]) & _MASK255
        bad = np.asarray((values >= _P255).any(axis=-1))
        values = np.where(values >= _P255, 0, values)
        y = self._correct(_Leaf, values, child_ctrl, d.w_leaf[:, None, :])
        if bad.any():
            self._redo(y, bad, depth, seeds, ctrl, parent, bit, d, ctx)
        return next_seeds, child_ctrl, y

    @staticmethod
    def _correct(arith: _Arith, values: Arr, ctrl: Arr, w_cw: Arr) -> Arr:
        """``values + w_cw`` where the control bit is set."""
        corrected = arith.add(values, w_cw)
        return np.where(ctrl[..., None], corrected, values)

    def _redo(
        self,
        y: Arr,
        bad: Arr,
        depth: int,
        seeds: Arr,
        ctrl: Arr,
        parent: Arr,
        bit: Arr,
        d: _Decoded,
        ctx: bytes,
    ) -> None:
        """The nodes whose value stream hit a candidate >= p (rejection
        sampling shifts the stream; about 2^-32 per Field64 element): their
        values from their parents (``seeds``, ``ctrl`` at ``depth - 1``)
        through the scalar ``eval_next``, exactly."""
        for r, n in zip(*np.nonzero(bad), strict=True):
            nonce = d.nonces[r].tobytes()
            payload = d.w_leaf[r] if depth == self.BITS - 1 else d.w_inner[r, depth]
            word = CorrectionWord(
                _bytes_of(d.seed_cw[r, depth]),
                (bool(d.ctrl_cw[r, depth, 0]), bool(d.ctrl_cw[r, depth, 1])),
                [int(v) for v in payload],
            )
            _, _, values = self.idpf.eval_next(
                FixedKeys(nonce),
                _bytes_of(seeds[r, parent[n]]),
                bool(ctrl[r, parent[n]]),
                word,
                depth,
                bool(bit[n]),
                ctx,
                nonce,
            )
            y[r, n] = values

    # -- sharding ------------------------------------------------------------

    def shard_batch(
        self,
        ctx: bytes,
        measurements: Sequence[Sequence[bool]],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        """``Poplar1.shard`` for every report, encoded. ValueError (naming
        the report) on a bad measurement, nonce or ``rand`` size."""
        vdaf = self.vdaf
        rows = len(measurements)
        if len(nonces) != rows or len(rands) != rows:
            raise ValueError("measurements, nonces and rands must have the same length")
        for i, (m, n, rand) in enumerate(zip(measurements, nonces, rands, strict=True)):
            if len(m) != self.BITS or any(not isinstance(b, bool) for b in m):
                raise ValueError(f"report {i}: a Poplar1({self.BITS}) measurement is bools")
            if len(n) != vdaf.NONCE_SIZE:
                raise ValueError(f"report {i}: nonce must be {vdaf.NONCE_SIZE} bytes")
            if len(rand) != vdaf.RAND_SIZE:
                raise ValueError(f"report {i}: rand must be {vdaf.RAND_SIZE} bytes")
        if rows == 0:
            return ShardBatch([], [[], []])
        bits = self.BITS
        alpha = np.array(measurements, dtype=bool).reshape(rows, bits)
        nonce_rows = np.frombuffer(b"".join(nonces), dtype=np.uint8).reshape(rows, -1)
        rand_rows = np.frombuffer(b"".join(rands), dtype=np.uint8).reshape(rows, -1)
        keys = _u64(rand_rows[:, :32]).reshape(rows, 2, 2)
        corr_seeds = [rand_rows[:, 32:64], rand_rows[:, 64:96]]
        shard_seeds = rand_rows[:, 96:128]
        redo = np.zeros(rows, dtype=bool)  # rows a rejected candidate shifted

        # The shard XOF's stream: the authenticators k (inner, then leaf),
        # then two elements per level for the helper's (A, B) shares.
        inner_len, leaf_len = 8 * (bits - 1), 32
        stream = xof_rows(
            shard_seeds,
            vdaf.domain_separation_tag(USAGE_SHARD_RAND, ctx),
            nonce_rows,
            inner_len * 3 + leaf_len * 3,
            rows,
        )
        k_inner = _u64(stream[:, :inner_len])
        redo |= (k_inner >= _P64).any(axis=1)
        k_leaf = _ints255(stream[:, inner_len : inner_len + 32])[:, 0] & _MASK255
        redo |= k_leaf >= _P255
        offset = inner_len + 32
        corr1_inner = _u64(stream[:, offset : offset + 2 * inner_len]).reshape(rows, bits - 1, 2)
        redo |= (corr1_inner >= _P64).any(axis=(1, 2))
        corr1_leaf = _ints255(stream[:, offset + 2 * inner_len :]) & _MASK255
        redo |= (corr1_leaf >= _P255).any(axis=1)

        public, redo_gen = self._gen(ctx, alpha, nonce_rows, keys, k_inner, k_leaf)
        redo |= redo_gen

        # The (a, b, c) offsets of both aggregators' seeds, and (A, B).
        offsets = []
        leaf_offsets = []
        for j in (0, 1):
            binders = np.concatenate([np.full((rows, 1), j, np.uint8), nonce_rows], axis=1)
            offsets.append(
                expand_rows(
                    VecField64,
                    corr_seeds[j],
                    vdaf.domain_separation_tag(USAGE_CORR_INNER, ctx),
                    binders,
                    3 * (bits - 1),
                    rows,
                )
            )
            leaf_offsets.append(
                self._expand_leaf(
                    corr_seeds[j], vdaf.domain_separation_tag(USAGE_CORR_LEAF, ctx), binders, 3
                )
            )
        abc = VecField64.add(offsets[0], offsets[1]).reshape(rows, bits - 1, 3)
        a, b, c = abc[..., 0], abc[..., 1], abc[..., 2]
        # A = -2a + k, B = a^2 + b - a*k + c (BBCGGI21, Appendix C.4).
        big_a = VecField64.sub(k_inner, VecField64.add(a, a))
        big_b = VecField64.add(
            VecField64.sub(VecField64.add(VecField64.mul(a, a), b), VecField64.mul(a, k_inner)), c
        )
        corr0_inner = VecField64.sub(np.stack([big_a, big_b], axis=2), corr1_inner)
        la, lb, lc = (_Leaf.add(leaf_offsets[0], leaf_offsets[1])[:, i] for i in range(3))
        leaf_a = (k_leaf - 2 * la) % _P255
        leaf_b = (la * la + lb - la * k_leaf + lc) % _P255
        corr0_leaf = _Leaf.sub(np.stack([leaf_a, leaf_b], axis=1), corr1_leaf)

        key_bytes = np.frombuffer(_bytes_of(keys), np.uint8).reshape(rows, 2, 16)
        inner_bytes = [
            np.frombuffer(_bytes_of(v), np.uint8).reshape(rows, -1)
            for v in (corr0_inner, corr1_inner)
        ]
        input_shares: list[list[bytes]] = [[], []]
        for r in range(rows):
            for j, leaf in enumerate((corr0_leaf, corr1_leaf)):
                input_shares[j].append(
                    key_bytes[r, j].tobytes()
                    + corr_seeds[j][r].tobytes()
                    + inner_bytes[j][r].tobytes()
                    + _encode255(leaf[r])
                )
        for row in np.flatnonzero(redo).tolist():
            public_share, shares = vdaf.shard(ctx, measurements[row], nonces[row], rands[row])
            public[row] = vdaf.encode_public_share(public_share)
            for j in (0, 1):
                input_shares[j][row] = vdaf.encode_input_share(shares[j])
        return ShardBatch(public, input_shares)

    def _gen(
        self,
        ctx: bytes,
        alpha: Arr,
        nonces: Arr,
        keys: Arr,
        k_inner: Arr,
        k_leaf: Arr,
    ) -> tuple[list[bytes], Arr]:
        """``IdpfBBCGGI21.gen`` for every report with the values (1, k) at
        each level: the encoded public shares, and the rows whose value
        stream hit a rejected candidate (to be redone exactly)."""
        rows, bits = alpha.shape
        extend = self._fixed_keys(DST_EXTEND + ctx, nonces)
        convert = self._fixed_keys(DST_CONVERT + ctx, nonces)
        seeds = keys.copy()  # (R, 2 keys, 2 words)
        ctrl = np.zeros((rows, 2), dtype=bool)
        ctrl[:, 1] = True
        redo = np.zeros(rows, dtype=bool)
        ctrl_cw = np.zeros((rows, bits, 2), dtype=bool)
        seed_cw = np.zeros((rows, bits, 2), dtype=np.uint64)
        w_inner = np.zeros((rows, bits - 1, 2), dtype=np.uint64)
        w_leaf = _Leaf.zeros((rows, 2))
        index = np.arange(rows)
        for level in range(bits):
            leaf = level == bits - 1
            bit = alpha[:, level]
            keep, lose = bit.astype(np.intp), (~bit).astype(np.intp)
            if leaf:
                s = _u64(self._leaf_xof(DST_EXTEND + ctx, seeds, nonces, 32)).reshape(rows, 2, 2, 2)
            else:
                s = _hash_rows(extend, seeds, 2)  # (R, key, child, word)
            t = (s[..., 0] & _ONE).astype(bool)
            s[..., 0] &= ~_ONE
            cw = s[index, 0, lose] ^ s[index, 1, lose]
            cc = np.stack([t[:, 0, 0] ^ t[:, 1, 0] ^ ~bit, t[:, 0, 1] ^ t[:, 1, 1] ^ bit], axis=1)
            seed_cw[:, level] = cw
            ctrl_cw[:, level] = cc
            kept = s[index, :, keep]  # (R, key, word)
            x = kept ^ np.where(ctrl[:, :, None], cw[:, None, :], np.uint64(0))
            ctrl = t[index, :, keep] ^ (ctrl & cc[index, keep][:, None])
            if leaf:
                raw = self._leaf_xof(DST_CONVERT + ctx, x, nonces, 16 + 64)
                seeds = _u64(raw[..., :16])
                w = _ints255(raw[..., 16:]) & _MASK255  # (R, key, 2)
                redo |= (w >= _P255).any(axis=(1, 2))
                beta = np.stack([np.full(rows, 1, dtype=object), k_leaf], axis=1)
                w_cw = _Leaf.add(_Leaf.sub(beta, w[:, 0]), w[:, 1])
                w_leaf = np.where(ctrl[:, 1:2], _Leaf.neg(w_cw), w_cw)
            else:
                out = _hash_rows(convert, x, 2)
                seeds = np.ascontiguousarray(out[:, :, 0, :])
                w = out[:, :, 1, :]  # (R, key, 2)
                redo |= (w >= _P64).any(axis=(1, 2))
                beta = np.stack([np.ones(rows, np.uint64), k_inner[:, level]], axis=1)
                w_cw = VecField64.add(VecField64.sub(beta, w[:, 0]), w[:, 1])
                w_inner[:, level] = np.where(ctrl[:, 1:2], VecField64.neg(w_cw), w_cw)
        packed = np.packbits(ctrl_cw.reshape(rows, 2 * bits), axis=1, bitorder="little")
        seed_bytes = np.frombuffer(_bytes_of(seed_cw), np.uint8).reshape(rows, -1)
        inner_bytes = np.frombuffer(_bytes_of(w_inner), np.uint8).reshape(rows, -1)
        public = [
            packed[r].tobytes()
            + seed_bytes[r].tobytes()
            + inner_bytes[r].tobytes()
            + _encode255(w_leaf[r])
            for r in range(rows)
        ]
        return public, redo

    # -- verification --------------------------------------------------------

    def verify_init_batch(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: Poplar1AggParam,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes | None],
        input_shares: Sequence[bytes | None],
        cache: IdpfCache | None = None,
    ) -> VerifyRoundBatch:
        """``Poplar1.verify_init`` for every report, from encoded shares.
        With ``cache`` (this aggregator's cache of the previous level for
        the same reports), the walk starts there; the returned cache serves
        the next level. ``AggParamError`` for a malformed parameter (or,
        with a cache, one that breaks the draft's sequence rule)."""
        vdaf = self.vdaf
        if len(verify_key) != vdaf.VERIFY_KEY_SIZE:
            raise ValueError(f"verify_key must be {vdaf.VERIFY_KEY_SIZE} bytes")
        if agg_id not in range(self.SHARES):
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        if not len(nonces) == len(public_shares) == len(input_shares):
            raise ValueError("nonces, public shares and input shares must have the same length")
        vdaf.check_agg_param(agg_param)
        level, prefixes = agg_param
        d = self._decode(agg_id, nonces, public_shares, input_shares)
        rows = len(nonces)
        arith = self._arith(level)
        data, auth, new_cache = self._eval(agg_id, level, prefixes, ctx, d, cache)

        # The level's (a, b, c) shares, and (A, B) from the input share.
        binders = np.concatenate([np.full((rows, 1), agg_id, dtype=np.uint8), d.nonces], axis=1)
        if level < self.BITS - 1:
            dst = vdaf.domain_separation_tag(USAGE_CORR_INNER, ctx)
            abc = expand_rows(VecField64, d.corr_seeds, dst, binders, 3 * level + 3, rows)[:, -3:]
            big_a = d.corr_inner[:, 2 * level]
            big_b = d.corr_inner[:, 2 * level + 1]
        else:
            dst = vdaf.domain_separation_tag(USAGE_CORR_LEAF, ctx)
            abc = self._expand_leaf(d.corr_seeds, dst, binders, 3)
            big_a, big_b = d.corr_leaf[:, 0], d.corr_leaf[:, 1]
        verify_rand = self._verify_rand(verify_key, ctx, d.nonces, level, len(prefixes))
        s0 = arith.add(abc[:, 0], arith.dot(data, verify_rand))
        s1 = arith.add(abc[:, 1], arith.dot(data, arith.mul(verify_rand, verify_rand)))
        s2 = arith.add(abc[:, 2], arith.dot(auth, verify_rand))
        sketch = np.stack([s0, s1, s2], axis=1)
        state = BatchVerifyState(EVALUATE_SKETCH, level, agg_id, big_a, big_b, data, d.errors)
        return VerifyRoundBatch(state, self._encode_rows(arith, sketch, d.errors), new_cache)

    def _verify_rand(
        self, verify_key: bytes, ctx: bytes, nonces: Arr, level: int, count: int
    ) -> Arr:
        rows = nonces.shape[0]
        dst = self.vdaf.domain_separation_tag(USAGE_VERIFY_RAND, ctx)
        binders = np.concatenate(
            [nonces, np.broadcast_to(np.frombuffer(level.to_bytes(2, "big"), np.uint8), (rows, 2))],
            axis=1,
        )
        if level < self.BITS - 1:
            return expand_rows(VecField64, verify_key, dst, binders, count, rows)
        return self._expand_leaf(verify_key, dst, binders, count)

    def _expand_leaf(self, seeds: Arr | bytes, dst: bytes, binders: Arr, count: int) -> Arr:
        """XofTurboShake128.expand_into_vec over Field255 for each row, as
        an object array ``(rows, count)``; a row with a rejected candidate
        (about 2^-251 each) is redone by the scalar sampler."""
        rows = binders.shape[0]
        raw = xof_rows(seeds, dst, binders, 32 * count, rows)
        values = _ints255(raw) & _MASK255
        for r in np.flatnonzero((values >= _P255).any(axis=1)):
            seed = seeds if isinstance(seeds, bytes) else seeds[r].tobytes()
            values[r] = self.vdaf.xof.expand_into_vec(
                Field255, seed, dst, binders[r].tobytes(), count
            )
        return values

    def _encode_rows(self, arith: _Arith, values: Arr, errors: Errors) -> list[bytes | None]:
        rows, count = values.shape
        encoded = arith.encode(values)
        width = count * arith.SIZE
        return [
            encoded[r * width : (r + 1) * width] if errors[r] is None else None for r in range(rows)
        ]

    def _decode_rows(
        self, level: int, count: int, encoded: Sequence[bytes | None], what: str, errors: Errors
    ) -> Arr:
        arith = self._arith(level)
        raw = _rows(encoded, count * arith.SIZE, what, errors)
        values, ok = arith.decode(raw)
        _flag(errors, ~ok.all(axis=1), CodecError(f"{what}: element not reduced"))
        return np.where(ok, values, arith.from_int(0))

    def verifier_shares_to_message_batch(
        self,
        ctx: bytes,
        agg_param: Poplar1AggParam,
        verifier_shares: Sequence[Sequence[bytes | None]],
    ) -> MessageBatch:
        """``Poplar1.verifier_shares_to_message`` for every report: the
        encoded round-1 sketch, or after round 2 ``b""`` for a report the
        sketch accepts and ``VerifyError`` for one it rejects. The round is
        read from the shares' length."""
        if len(verifier_shares) != self.SHARES:
            raise ValueError(f"expected {self.SHARES} lists of verifier shares")
        first, second = verifier_shares
        if len(first) != len(second):
            raise ValueError("the aggregators' verifier shares differ in number")
        level = agg_param.level
        arith = self._arith(level)
        rows = len(first)
        errors: Errors = [
            None if a is not None and b is not None else VerifyError("a verifier share is missing")
            for a, b in zip(first, second, strict=True)
        ]
        lengths = {len(s) for s in (*first, *second) if s is not None}
        count = 3 if 3 * arith.SIZE in lengths else 1
        a = self._decode_rows(level, count, first, "verifier share", errors)
        b = self._decode_rows(level, count, second, "verifier share", errors)
        sketch = arith.add(a, b)
        if count == 3:
            return MessageBatch(self._encode_rows(arith, sketch, errors), errors)
        zero = sketch[:, 0] == arith.from_int(0)
        _flag(errors, ~zero, VerifyError("sketch verification failed: the report is not one-hot"))
        return MessageBatch([b"" if errors[r] is None else None for r in range(rows)], errors)

    def verify_next_batch(
        self,
        ctx: bytes,
        state: BatchVerifyState,
        messages: MessageBatch | Sequence[bytes | None],
    ) -> VerifyRoundBatch | Poplar1OutShareBatch:
        """``Poplar1.verify_next`` for every report: after round 1 the second
        sketch shares (a ``VerifyRoundBatch``), after round 2 the output
        shares (a ``Poplar1OutShareBatch``). Given the ``MessageBatch``
        itself (in one process), a report it rejected keeps its error."""
        errors = list(state.errors)
        if isinstance(messages, MessageBatch):
            for r, error in enumerate(messages.errors):
                if errors[r] is None and error is not None:
                    errors[r] = error
            messages = messages.messages
        if len(messages) != len(state):
            raise ValueError("one verifier message per report")
        for r, m in enumerate(messages):
            if errors[r] is None and m is None:
                errors[r] = VerifyError("the report was rejected: no verifier message")
        arith = self._arith(state.level)
        if state.step == EVALUATE_SKETCH:
            sketch = self._decode_rows(state.level, 3, messages, "verifier message", errors)
            s0, s1, s2 = sketch[:, 0], sketch[:, 1], sketch[:, 2]
            share = arith.add(arith.mul(state.a_share, s0), state.b_share)
            if state.agg_id == 1:
                share = arith.add(share, arith.sub(arith.sub(arith.mul(s0, s0), s1), s2))
            revealed = BatchVerifyState(
                REVEAL_SKETCH,
                state.level,
                state.agg_id,
                state.a_share,
                state.b_share,
                state.out_shares,
                errors,
            )
            return VerifyRoundBatch(
                revealed, self._encode_rows(arith, share.reshape(-1, 1), errors)
            )
        for r, m in enumerate(messages):
            if errors[r] is None and m != b"":
                errors[r] = VerifyError("the second verifier message is empty")
        return Poplar1OutShareBatch(state.level, state.out_shares, errors)

    def aggregate_batch(self, out: Poplar1OutShareBatch) -> FieldVec:
        """The aggregate share of the accepted reports' output shares."""
        arith = self._arith(out.level)
        rows = out.out_shares[out.ok]
        if arith is _Inner:
            total = VecField64.sum(np.ascontiguousarray(rows.T), axis=-1)
        else:
            total = rows.sum(axis=0) % _P255 if len(rows) else arith.zeros(out.out_shares.shape[1:])
        return FieldVec(arith.field, arith.to_ints(np.asarray(total).reshape(-1)))

"""The IDPF of BBCGGI21 (draft-irtf-cfrg-vdaf-20, Sections 8.1 and 8.3)
over many reports at once: the batched counterpart of
``veil.vdaf.spec.idpf``, which it agrees with byte for byte.

``BatchIdpf.gen`` makes every report's public share (the client side of
``BatchPoplar1.shard_batch``); ``BatchIdpf.eval`` walks one aggregator's
keys down the prefix tree of an aggregation parameter's candidates, and
returns an ``IdpfCache`` from which the next level continues. ``Inner`` and
``Leaf`` are the two levels' fields (Field64, Field255) as NumPy arrays.

Every report has its own AES key (derived from its nonce), so AES runs per
report through OpenSSL (``veil.vdaf.batch.aes``): one call hashes all of a
report's nodes at a depth; everything between the calls is NumPy or the
compiled loops of ``veil.vdaf.batch._idpf_kernels``. Why the walk is shaped
this way (the prefix tree, the cache, sub-batches) is told in
``veil.vdaf.batch.poplar1``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from veil.vdaf.batch.aes import RowAes
from veil.vdaf.batch.field import Arr, VecField64
from veil.vdaf.batch.kernels import idpf_kernels
from veil.vdaf.batch.xof import turboshake_rows
from veil.vdaf.errors import AggParamSequenceError
from veil.vdaf.spec.field import Field, Field64, Field255
from veil.vdaf.spec.idpf import DST_CONVERT, DST_EXTEND, CorrectionWord, FixedKeys, IdpfBBCGGI21
from veil.vdaf.spec.poplar1 import Prefix

P64 = np.uint64(Field64.MODULUS)
P255 = Field255.MODULUS
MASK255 = (1 << 255) - 1
_ONE = np.uint64(1)
_LITTLE = sys.byteorder == "little"
# p = 2^255 - 19 as little-endian 64-bit words: low, two full, top.
_P255_LOW = np.uint64(P255 & (2**64 - 1))
_FULL = np.uint64(2**64 - 1)
_P255_TOP = np.uint64(P255 >> 192)


def u64(raw: Arr) -> Arr:
    """Little-endian 8-byte groups of the last axis as native ``uint64``
    (a new array: one copy, where a contiguous copy and a conversion were
    two)."""
    if not _LITTLE:
        return np.ascontiguousarray(raw).view("<u8").astype(np.uint64)
    out = np.empty((*raw.shape[:-1], raw.shape[-1] // 8), dtype=np.uint64)
    out.view(np.uint8)[...] = raw
    return out


def words(raw: Arr) -> Arr:
    """Like ``u64``, but a view of ``raw`` where the machine is
    little-endian and the words fall aligned (its last axis must be
    contiguous; read-only if ``raw`` is): for the long correction words a
    decoder checks in full but a level reads one depth of."""
    if not _LITTLE:
        return u64(raw)
    view = raw.view(np.uint64)
    return view if view.flags.aligned else u64(raw)


def _kernel_input(a: Arr) -> Arr:
    """``a`` as the compiled kernels' signatures take it: C-contiguous and
    writable. A depth's correction words are a view of the decoded public
    shares (``words``), which are read-only where they were read from bytes
    and contiguous where the batch has one report: such a view is copied
    too, as every wider batch's is."""
    return np.require(a, requirements=["C", "W"])


def bytes_of(a: Arr) -> bytes:
    """The little-endian bytes of a ``uint64`` array, in C order."""
    return np.ascontiguousarray(a, dtype="<u8").tobytes()


def ints255(raw: Arr) -> Arr:
    """32-byte little-endian groups of the last axis as Python ints (an
    object array of one fewer byte axis, 32 times shorter)."""
    shape = (*raw.shape[:-1], raw.shape[-1] // 32)
    flat = np.ascontiguousarray(raw).tobytes()
    values = np.empty(len(flat) // 32, dtype=object)
    values[:] = [int.from_bytes(flat[i : i + 32], "little") for i in range(0, len(flat), 32)]
    return values.reshape(shape)


def encode255(values: Arr) -> bytes:
    return b"".join(int(v).to_bytes(32, "little") for v in values.reshape(-1))


# -- the level's field, as arrays -------------------------------------------


class Inner:
    """Field64 on ``uint64`` arrays (the compiled kernels)."""

    field: type[Field] = Field64
    SIZE = 8

    @staticmethod
    def decode(raw: Arr) -> tuple[Arr, Arr]:
        """The elements (a view of ``raw`` where the machine allows it)
        and whether each is reduced."""
        values = words(raw)
        return values, values < P64

    @staticmethod
    def encode(values: Arr) -> bytes:
        return bytes_of(values)

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


class Leaf:
    """Field255 on NumPy object arrays of Python ints."""

    field: type[Field] = Field255
    SIZE = 32

    @staticmethod
    def decode(raw: Arr) -> tuple[Arr, Arr]:
        values = ints255(raw)
        return values, values < P255

    @staticmethod
    def reduced(raw: Arr) -> Arr:
        """Whether each 32-byte little-endian group of the last axis is
        below p, from its 64-bit words (no Python ints): ``decode``'s mask
        for a level that does not need the values."""
        words = u64(raw).reshape(*raw.shape[:-1], raw.shape[-1] // 32, 4)  # (also of no row)
        low, mid, high, top = (words[..., i] for i in range(4))
        at_least_p = (top > _P255_TOP) | (
            (top == _P255_TOP) & (high == _FULL) & (mid == _FULL) & (low >= _P255_LOW)
        )
        return np.asarray(~at_least_p)

    @staticmethod
    def encode(values: Arr) -> bytes:
        return encode255(values)

    @staticmethod
    def zeros(shape: tuple[int, ...]) -> Arr:
        out = np.empty(shape, dtype=object)
        out.fill(0)
        return out

    @staticmethod
    def add(a: Arr, b: Arr) -> Arr:
        return (a + b) % P255

    @staticmethod
    def sub(a: Arr, b: Arr) -> Arr:
        return (a - b) % P255

    @staticmethod
    def mul(a: Arr, b: Arr) -> Arr:
        return (a * b) % P255

    @staticmethod
    def neg(a: Arr) -> Arr:
        return (-a) % P255

    @staticmethod
    def dot(a: Arr, b: Arr) -> Arr:
        return np.asarray((a * b).sum(axis=-1) % P255)

    @staticmethod
    def from_int(value: int) -> Any:
        return value

    @staticmethod
    def to_ints(values: Arr) -> list[int]:
        return [int(v) for v in values]


Arith = type[Inner] | type[Leaf]


# -- the IDPF over many reports ----------------------------------------------


def _hash_rows(aes: RowAes, seeds: Arr, count: int) -> Arr:
    """Blocks 0 to ``count - 1`` of XofFixedKeyAes128's stream for each
    seed (``(reports, nodes, 2)`` ``uint64``): ``AES(s) xor s`` with ``s =
    sigma(seed xor le128(i))``; ``(reports, nodes, count, 2)``."""
    lo, hi = seeds[..., 0], seeds[..., 1]
    sigma = np.empty((*seeds.shape[:-1], count, 2), dtype=np.uint64)
    for i in range(count):
        sigma[..., i, 0] = hi
        sigma[..., i, 1] = hi ^ lo ^ np.uint64(i)
    return aes.encrypt(sigma) ^ sigma


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
    report's two fixed AES keys (extend, convert). The nodes kept
    are those of the deepest depth with at most ``BatchIdpf.cache_nodes``
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
    extend: RowAes
    convert: RowAes


@dataclass
class IdpfShares:
    """One aggregator's IDPF inputs for a batch, decoded: the reports'
    nonces, the public shares' correction words by level, and the key. The
    leaf's payload corrections (Field255) stay bytes, checked reduced by
    the decoder, until a walk reaches the leaf (``w_leaf``): as Python ints
    they cost a level that never reads them about as much as its walk."""

    nonces: Arr  # (R, 16) uint8
    ctrl_cw: Arr  # (R, BITS, 2) bool
    seed_cw: Arr  # (R, BITS, 2) uint64
    w_inner: Arr  # (R, BITS - 1, 2) uint64
    w_leaf_bytes: Arr  # (R, 64) uint8
    keys: Arr  # (R, 2) uint64

    @cached_property
    def w_leaf(self) -> Arr:
        """The leaf's payload corrections, ``(R, 2)`` Python ints."""
        return ints255(self.w_leaf_bytes)

    def part(self, rows: slice) -> IdpfShares:
        """The same reports' rows ``rows``."""
        return IdpfShares(
            self.nonces[rows],
            self.ctrl_cw[rows],
            self.seed_cw[rows],
            self.w_inner[rows],
            self.w_leaf_bytes[rows],
            self.keys[rows],
        )


class BatchIdpf:
    """The batched IDPF of one ``IdpfBBCGGI21`` instance."""

    # Nodes (reports x nodes of one depth) per sub-batch of the walk:
    # about 40 bytes each across its arrays, so some tens of MiB however
    # many reports and candidates are passed.
    chunk_nodes = 1 << 18
    # Nodes per report an IdpfCache keeps (16 bytes and a bit each).
    cache_nodes = 1 << 12

    def __init__(self, idpf: IdpfBBCGGI21) -> None:
        self.idpf = idpf
        self.BITS = idpf.BITS

    def arith(self, level: int) -> Arith:
        """The level's field: Field64 above the leaf, Field255 at it."""
        return Inner if level < self.BITS - 1 else Leaf

    # -- fixed AES keys ----------------------------------------------------

    def fixed_keys(self, dst: bytes, nonces: Arr) -> RowAes:
        """Each report's AES-128 encryption under its fixed key for ``dst``
        (TurboSHAKE128, domain byte 2, of the tag and the nonce)."""
        rows = nonces.shape[0]
        prefix = np.frombuffer(len(dst).to_bytes(2, "little") + dst, dtype=np.uint8)
        messages = np.concatenate([np.broadcast_to(prefix, (rows, len(prefix))), nonces], axis=1)
        return RowAes(turboshake_rows(messages, 16, domain=2))

    def _leaf_xof(self, dst: bytes, seeds: Arr, nonces: Arr, out_len: int) -> Arr:
        """XofTurboShake128 with 16-byte seeds (the IDPF's leaf level) for
        each (report, node): ``seeds`` ``(R, N, 2)`` ``uint64``; bytes
        ``(R, N, out_len)``."""
        rows, nodes = seeds.shape[:2]
        head = np.frombuffer(len(dst).to_bytes(2, "little") + dst + bytes([16]), dtype=np.uint8)
        seed_bytes = np.frombuffer(bytes_of(seeds), dtype=np.uint8).reshape(rows, nodes, 16)
        messages = np.concatenate(
            [
                np.broadcast_to(head, (rows, nodes, len(head))),
                seed_bytes,
                np.broadcast_to(nonces[:, None, :], (rows, nodes, nonces.shape[1])),
            ],
            axis=2,
            # The width written out: NumPy cannot infer it where there is no node.
        ).reshape(rows * nodes, len(head) + 16 + nonces.shape[1])
        return turboshake_rows(messages, out_len).reshape(rows, nodes, out_len)

    # -- evaluation --------------------------------------------------------

    def eval(
        self,
        agg_id: int,
        level: int,
        prefixes: tuple[Prefix, ...],
        ctx: bytes,
        d: IdpfShares,
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
            extend = self.fixed_keys(DST_EXTEND + ctx, d.nonces)
            convert = self.fixed_keys(DST_CONVERT + ctx, d.nonces)
        steps = _tree(level, prefixes, start, roots)
        # The depth whose nodes the next level starts from: the deepest
        # with few enough nodes (else the depth already cached).
        keep = start - 1
        for depth, (nodes, _, _) in zip(range(start, level + 1), steps, strict=True):
            if len(nodes) <= self.cache_nodes:
                keep = depth
        # (No node at all where the candidate set, or the cached one, is empty.)
        widest = max([1, len(roots), *(len(nodes) for nodes, _, _ in steps)])
        step_rows = max(1, self.chunk_nodes // widest)
        arith = self.arith(level)
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
                    extend.part(part),
                    convert.part(part),
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
        d: IdpfShares,
        ctx: bytes,
        extend: RowAes,
        convert: RowAes,
    ) -> tuple[Arr, Arr, Arr | None]:
        """One depth of the tree: the children ``(parent, bit)`` of the
        nodes ``(seeds, ctrl)`` at ``depth - 1``; their seeds, control bits
        and, at the last depth, their value shares ``(R, N, 2)``."""
        if depth == self.BITS - 1:
            return self._leaf_step(last, seeds, ctrl, parent, bit, d, ctx)
        k = idpf_kernels()
        rows, nodes = seeds.shape[0], len(parent)
        seeds = _kernel_input(seeds)
        ctrl = _kernel_input(ctrl)
        sigma = np.empty((rows, seeds.shape[1], 2, 2), dtype=np.uint64)
        k.sigma_blocks(seeds, 2, sigma)
        hashed = extend.encrypt(sigma)
        count = 2 if last else 1
        child_ctrl = np.empty((rows, nodes), dtype=bool)
        conv_sigma = np.empty((rows, nodes, count, 2), dtype=np.uint64)
        k.extend_children(
            hashed,
            sigma,
            ctrl,
            _kernel_input(d.seed_cw[:, depth]),
            _kernel_input(d.ctrl_cw[:, depth]),
            parent,
            bit,
            count,
            child_ctrl,
            conv_sigma,
        )
        hashed = convert.encrypt(conv_sigma)
        next_seeds = np.empty((rows, nodes, 2), dtype=np.uint64)
        values = np.zeros((rows, nodes, 2), dtype=np.uint64)
        bad = np.zeros((rows, nodes), dtype=bool)
        k.convert_nodes(
            hashed,
            conv_sigma,
            child_ctrl,
            _kernel_input(d.w_inner[:, depth]),
            last,
            next_seeds,
            values,
            bad,
        )
        if not last:
            return next_seeds, child_ctrl, None
        if bad.any():
            self.redo(values, bad, depth, seeds, ctrl, parent, bit, d, ctx)
        return next_seeds, child_ctrl, values

    def _leaf_step(
        self,
        last: bool,
        seeds: Arr,
        ctrl: Arr,
        parent: Arr,
        bit: Arr,
        d: IdpfShares,
        ctx: bytes,
    ) -> tuple[Arr, Arr, Arr | None]:
        """``_step`` at the leaf level, where both hashes are
        XofTurboShake128 and the values Field255 (one level of many: NumPy
        and Python ints)."""
        depth = self.BITS - 1
        rows = seeds.shape[0]
        raw = self._leaf_xof(DST_EXTEND + ctx, seeds, d.nonces, 32)
        s = u64(raw).reshape(rows, seeds.shape[1], 2, 2)
        t = (s[..., 0] & _ONE).astype(bool)
        s[..., 0] &= ~_ONE
        # The correction of a node whose control bit is set.
        on = ctrl[:, :, None, None]
        s ^= np.where(on, d.seed_cw[:, None, None, depth, :], np.uint64(0))
        t ^= ctrl[:, :, None] & d.ctrl_cw[:, None, depth, :]
        child_seeds = s[:, parent, bit]
        child_ctrl = t[:, parent, bit]
        raw = self._leaf_xof(DST_CONVERT + ctx, child_seeds, d.nonces, 16 + 64)
        next_seeds = u64(raw[..., :16])
        if not last:
            return next_seeds, child_ctrl, None
        values = ints255(raw[..., 16:]) & MASK255
        bad = np.asarray((values >= P255).any(axis=-1))
        values = np.where(values >= P255, 0, values)
        y = self._correct(Leaf, values, child_ctrl, d.w_leaf[:, None, :])
        if bad.any():
            self.redo(y, bad, depth, seeds, ctrl, parent, bit, d, ctx)
        return next_seeds, child_ctrl, y

    @staticmethod
    def _correct(arith: Arith, values: Arr, ctrl: Arr, w_cw: Arr) -> Arr:
        """``values + w_cw`` where the control bit is set."""
        corrected = arith.add(values, w_cw)
        return np.where(ctrl[..., None], corrected, values)

    def redo(
        self,
        y: Arr,
        bad: Arr,
        depth: int,
        seeds: Arr,
        ctrl: Arr,
        parent: Arr,
        bit: Arr,
        d: IdpfShares,
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
                bytes_of(d.seed_cw[r, depth]),
                (bool(d.ctrl_cw[r, depth, 0]), bool(d.ctrl_cw[r, depth, 1])),
                [int(v) for v in payload],
            )
            _, _, values = self.idpf.eval_next(
                FixedKeys(nonce),
                bytes_of(seeds[r, parent[n]]),
                bool(ctrl[r, parent[n]]),
                word,
                depth,
                bool(bit[n]),
                ctx,
                nonce,
            )
            y[r, n] = values

    def gen(
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
        extend = self.fixed_keys(DST_EXTEND + ctx, nonces)
        convert = self.fixed_keys(DST_CONVERT + ctx, nonces)
        seeds = keys.copy()  # (R, 2 keys, 2 words)
        ctrl = np.zeros((rows, 2), dtype=bool)
        ctrl[:, 1] = True
        redo = np.zeros(rows, dtype=bool)
        ctrl_cw = np.zeros((rows, bits, 2), dtype=bool)
        seed_cw = np.zeros((rows, bits, 2), dtype=np.uint64)
        w_inner = np.zeros((rows, bits - 1, 2), dtype=np.uint64)
        w_leaf = Leaf.zeros((rows, 2))
        index = np.arange(rows)
        for level in range(bits):
            leaf = level == bits - 1
            bit = alpha[:, level]
            keep, lose = bit.astype(np.intp), (~bit).astype(np.intp)
            if leaf:
                s = u64(self._leaf_xof(DST_EXTEND + ctx, seeds, nonces, 32)).reshape(rows, 2, 2, 2)
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
                seeds = u64(raw[..., :16])
                w = ints255(raw[..., 16:]) & MASK255  # (R, key, 2)
                redo |= (w >= P255).any(axis=(1, 2))
                beta = np.stack([np.full(rows, 1, dtype=object), k_leaf], axis=1)
                w_cw = Leaf.add(Leaf.sub(beta, w[:, 0]), w[:, 1])
                w_leaf = np.where(ctrl[:, 1:2], Leaf.neg(w_cw), w_cw)
            else:
                out = _hash_rows(convert, x, 2)
                seeds = np.ascontiguousarray(out[:, :, 0, :])
                w = out[:, :, 1, :]  # (R, key, 2)
                redo |= (w >= P64).any(axis=(1, 2))
                beta = np.stack([np.ones(rows, np.uint64), k_inner[:, level]], axis=1)
                w_cw = VecField64.add(VecField64.sub(beta, w[:, 0]), w[:, 1])
                w_inner[:, level] = np.where(ctrl[:, 1:2], VecField64.neg(w_cw), w_cw)
        packed = np.packbits(ctrl_cw.reshape(rows, 2 * bits), axis=1, bitorder="little")
        seed_bytes = np.frombuffer(bytes_of(seed_cw), np.uint8).reshape(rows, -1)
        inner_bytes = np.frombuffer(bytes_of(w_inner), np.uint8).reshape(rows, -1)
        public = [
            packed[r].tobytes()
            + seed_bytes[r].tobytes()
            + inner_bytes[r].tobytes()
            + encode255(w_leaf[r])
            for r in range(rows)
        ]
        return public, redo

"""The batched IDPF (veil.vdaf.batch.idpf): the exact fallback for a
rejected candidate in a node's value stream, and the Field255 check done on
64-bit words. The walk itself is checked against the scalar path through
BatchPoplar1 (test_poplar1.py)."""

from __future__ import annotations

import random

import numpy as np

from veil.vdaf.batch.idpf import Leaf, _tree
from veil.vdaf.batch.poplar1 import BatchPoplar1
from veil.vdaf.spec.field import Field255
from veil.vdaf.spec.poplar1 import Poplar1

CTX = b"veil batch idpf"


def test_the_fallback_for_rejected_candidates_agrees() -> None:
    """A node whose value stream would hold a candidate >= p (about 2^-32
    per element, so never met by chance in a test) is recomputed through
    the scalar XOF; redone on nodes without one, it gives the same values."""
    vdaf = Poplar1(6)
    batch = BatchPoplar1(vdaf)
    rng = random.Random(11)
    measurements = [tuple(rng.random() < 0.5 for _ in range(6)) for _ in range(5)]
    nonces = [rng.randbytes(16) for _ in measurements]
    rands = [rng.randbytes(vdaf.RAND_SIZE) for _ in measurements]
    sharded = batch.shard_batch(CTX, measurements, nonces, rands)
    d = batch._decode(1, nonces, sharded.public_shares, sharded.input_shares[1])
    for level in (3, 5):
        prefixes = tuple(sorted({m[: level + 1] for m in measurements}))
        parents = tuple(sorted({p[:level] for p in prefixes}))
        above = batch.walk.eval(1, level - 1, parents, CTX, d.idpf, None)[2]
        data, auth, _ = batch.walk.eval(1, level, prefixes, CTX, d.idpf, above)
        # The values before the aggregator's negation, redone for every node.
        arith = batch.walk.arith(level)
        y = np.stack([arith.neg(data), arith.neg(auth)], axis=-1)
        redone = np.zeros_like(y)
        _, parent, bit = _tree(level, prefixes, level, parents)[0]
        everywhere = np.ones(data.shape, dtype=bool)
        batch.walk.redo(
            redone, everywhere, level, above.seeds, above.ctrl, parent, bit, d.idpf, CTX
        )
        assert (redone == y).all()


def test_field255_reduced_from_words_agrees_with_python_ints() -> None:
    """The decoder checks the leaf's Field255 elements from their 64-bit
    words (no Python ints below the leaf): every boundary of p = 2^255 - 19."""
    p = Field255.MODULUS
    low = 2**64 - 1
    values = [0, 1, p - 1, p, p + 1, 2**255 - 1, 2**256 - 1, p - 2**64, p + 2**64]
    values += [(p >> 192) << 192, ((p >> 192) << 192) | low, (p >> 64) << 64, 2**255]
    raw = np.frombuffer(b"".join(v.to_bytes(32, "little") for v in values), dtype=np.uint8)
    assert Leaf.reduced(raw.reshape(1, -1)).tolist() == [[v < p for v in values]]
    # Rows (each one element), and an unaligned slice of a longer buffer.
    assert Leaf.reduced(raw.reshape(len(values), 32)).tolist() == [[v < p] for v in values]
    shifted = np.frombuffer(b"\x00" + raw.tobytes(), dtype=np.uint8)[1:]
    assert Leaf.reduced(shifted.reshape(1, -1)).tolist() == [[v < p for v in values]]

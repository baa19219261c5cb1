"""The batched XOF (veil.vdaf.batch.xof): TurboSHAKE128 and
XofTurboShake128 row by row against pycryptodome and the scalar XOF, and
the exact fallback of a row whose sampler rejects a candidate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from Crypto.Hash import TurboSHAKE128
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.vdaf import Field64, XofTurboShake128
from veil.vdaf.batch.field import VecField64, VecField128
from veil.vdaf.batch.kernels import kernels
from veil.vdaf.batch.xof import expand_rows, turboshake_rows, xof_rows

FIELDS = [VecField64, VecField128]


@settings(max_examples=20, deadline=None)
@given(
    seeds=st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=6),
    binder=st.binary(max_size=40),
    length=st.integers(0, 20),
)
def test_xof_rows_match_scalar(seeds: list[bytes], binder: bytes, length: int) -> None:
    dst = b"\x12\x00\x00\x00\x00\x01\x00\x05test"
    rows = len(seeds)
    seed_rows = np.frombuffer(b"".join(seeds), dtype=np.uint8).reshape(rows, 32)
    out = xof_rows(seed_rows, dst, binder, length * 3 + 1, rows)
    for i, seed in enumerate(seeds):
        assert out[i].tobytes() == XofTurboShake128(seed, dst, binder).next(length * 3 + 1)
    for vf in FIELDS:
        vec = expand_rows(vf, seed_rows, dst, binder, length, rows)
        want = [XofTurboShake128.expand_into_vec(vf.field, s, dst, binder, length) for s in seeds]
        assert vf.to_ints(vec) == want


def test_expand_rows_redoes_rejected_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row with a candidate >= p falls back to the scalar sampler; force
    the fallback (a real rejection needs ~2^32 draws in Field64) and check
    the row comes out as the scalar path has it."""
    real = VecField64.decode

    def decode_rejecting_row_1(raw: Any) -> tuple[Any, Any]:
        vec, ok = real(raw)
        ok = ok.copy()
        if ok.shape[0] > 1:
            ok[1, 0] = False
        return vec, ok

    monkeypatch.setattr(VecField64, "decode", staticmethod(decode_rejecting_row_1))
    seeds = [bytes([i]) * 32 for i in range(3)]
    seed_rows = np.frombuffer(b"".join(seeds), dtype=np.uint8).reshape(3, 32)
    vec = expand_rows(VecField64, seed_rows, b"dst", b"b", 4, 3)
    want = [XofTurboShake128.expand_into_vec(Field64, s, b"dst", b"b", 4) for s in seeds]
    assert VecField64.to_ints(vec) == want


@pytest.mark.parametrize(
    ("msg_len", "out_len"),
    [(0, 1), (1, 32), (167, 168), (168, 169), (169, 336), (336, 337), (500, 1000)],
)
def test_turboshake_rows_across_block_boundaries(msg_len: int, out_len: int) -> None:
    """The compiled sponge against pycryptodome's TurboSHAKE128 where the
    168-byte rate splits the input or the output."""
    rng = np.random.default_rng(msg_len * 1000 + out_len)
    messages = rng.integers(0, 256, (3, msg_len), dtype=np.uint8)
    # Long rows go to pycryptodome's one-shot call: check the compiled loop
    # on every size directly too.
    compiled = np.empty((3, out_len), dtype=np.uint8)
    kernels().turboshake128_rows(messages, np.uint8(1), compiled)
    out = turboshake_rows(messages, out_len)
    for i in range(3):
        want = TurboSHAKE128.new(domain=1, data=messages[i].tobytes()).read(out_len)
        assert out[i].tobytes() == want
        assert compiled[i].tobytes() == want

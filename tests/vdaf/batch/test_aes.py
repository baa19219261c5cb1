"""AES-128 under one key per report (veil.vdaf.batch.aes): libcrypto's
compiled loop and the ``cryptography`` fallback each against
``cryptography`` itself, row by row, and the batched Poplar1 through the
fallback against the official vectors."""

from __future__ import annotations

import ctypes
import ctypes.util
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.support.vdaf import poplar1_vectors_through_the_batch
from veil.vdaf.batch import aes
from veil.vdaf.batch.aes import RowAes
from veil.vdaf.batch.kernels import idpf_kernels


def _system_openssl3() -> bool:
    name = ctypes.util.find_library("crypto")
    if name is None:
        return False
    lib = ctypes.CDLL(name)
    lib.OpenSSL_version_num.restype = ctypes.c_ulong
    return bool(lib.OpenSSL_version_num() >= 0x30000000)


@pytest.fixture(params=["libcrypto", "cryptography"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "cryptography":
        monkeypatch.setattr(aes, "_loaded", None)
    elif aes._libcrypto() is None:
        pytest.skip("this machine has no OpenSSL 3 libcrypto")
    assert aes.backend().startswith(request.param)
    return str(request.param)


def _expected(keys: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    rows = blocks.shape[0]
    if rows == 0:
        return blocks.copy()
    raw = np.ascontiguousarray(blocks, dtype="<u8").view(np.uint8).reshape(rows, -1)
    out = [
        Cipher(algorithms.AES(keys[r].tobytes()), modes.ECB()).encryptor().update(raw[r].tobytes())
        for r in range(rows)
    ]
    joined = np.frombuffer(b"".join(out), dtype="<u8")
    return joined.reshape(blocks.shape).astype(np.uint64)


@pytest.mark.parametrize("shape", [(1, 1, 2), (5, 3, 2, 2), (40, 17, 2), (3, 0, 2), (0, 4, 2)])
def test_each_row_is_encrypted_under_its_own_key(backend: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    keys = rng.integers(0, 256, (shape[0], 16), dtype=np.uint8)
    blocks = rng.integers(0, 2**64, shape, dtype=np.uint64, endpoint=False)
    row_aes = RowAes(keys)
    hashed = row_aes.encrypt(blocks)
    assert hashed.shape == blocks.shape and hashed.dtype == np.uint64
    assert (hashed == _expected(keys, blocks)).all()
    # Again (the fallback keeps its contexts), and for a part of the rows,
    # from a strided (non-contiguous) input.
    assert (row_aes.encrypt(blocks) == hashed).all()
    part = row_aes.part(slice(1, None, 2))
    assert len(part) == len(range(1, shape[0], 2))
    strided = blocks[1::2]
    assert (part.encrypt(strided) == hashed[1::2]).all()


def test_the_fips_197_example() -> None:
    key = np.frombuffer(bytes(range(16)), dtype=np.uint8).reshape(1, 16)
    block = np.frombuffer(bytes.fromhex("00112233445566778899aabbccddeeff"), "<u8").reshape(1, 2)
    out = RowAes(key).encrypt(block.astype(np.uint64))
    assert out.astype("<u8").tobytes().hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="keys"):
        RowAes(np.zeros((3, 15), dtype=np.uint8))
    with pytest.raises(ValueError, match="keys"):
        RowAes(np.zeros(16, dtype=np.uint8))
    with pytest.raises(ValueError, match="one row of blocks per key"):
        RowAes(np.zeros((3, 16), dtype=np.uint8)).encrypt(np.zeros((2, 1, 2), dtype=np.uint64))


def test_the_compiled_loop_refuses_arrays_that_do_not_match() -> None:
    """aes_rows reads a key and writes an output row for each row of blocks:
    fewer keys or output rows, a key not of 16 bytes or a row not of whole
    blocks is refused before any call (views into larger arrays, so that a
    loop that went on would read and write inside them and succeed)."""
    lib = aes._libcrypto()
    if lib is None:
        pytest.skip("this machine has no OpenSSL 3 libcrypto")
    run = idpf_kernels().aes_rows

    def view(rows: int, width: int) -> np.ndarray:
        # C-ordered rows at the start of a buffer with room to spare.
        return np.zeros(4 * 64, dtype=np.uint8)[: rows * width].reshape(rows, width)

    assert run(lib.calls, view(4, 16), view(4, 48), view(4, 48)) == 0
    assert run(lib.calls, view(2, 16), view(4, 48), view(4, 48)) != 0
    assert run(lib.calls, view(4, 16), view(4, 48), view(2, 48)) != 0
    assert run(lib.calls, view(4, 12), view(4, 48), view(4, 48)) != 0
    assert run(lib.calls, view(4, 16), view(4, 40), view(4, 40)) != 0
    assert run(lib.calls, view(4, 16), view(4, 48), view(4, 32)) != 0


def test_rows_encrypted_from_threads_at_once() -> None:
    """The servers' thread pools call at once: each call has its own context."""
    rng = np.random.default_rng(3)
    work = [
        (rng.integers(0, 256, (64, 16), dtype=np.uint8), rng.integers(0, 2**63, (64, 9, 2)))
        for _ in range(8)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda kb: RowAes(kb[0]).encrypt(kb[1].astype(np.uint64)), work * 4))
    for (keys, blocks), hashed in zip(work * 4, got, strict=True):
        assert (hashed == _expected(keys, blocks.astype(np.uint64))).all()


def test_libcrypto_is_used_where_the_machine_has_openssl_3() -> None:
    if not _system_openssl3():
        pytest.skip("this machine has no OpenSSL 3 libcrypto")
    assert aes.backend().startswith("libcrypto (OpenSSL 3")


def test_the_vectors_pass_through_the_fallback(
    monkeypatch: pytest.MonkeyPatch, vdaf_vectors: Path
) -> None:
    monkeypatch.setattr(aes, "_loaded", None)
    poplar1_vectors_through_the_batch(vdaf_vectors)
    assert aes.backend() == "cryptography"


def test_many_keys_agree_with_cryptography_key_by_key() -> None:
    # Keys that differ in one bit each: the context is keyed again per row.
    rng = random.Random(7)
    base = rng.randbytes(16)
    keys = np.frombuffer(base, dtype=np.uint8).reshape(1, 16).repeat(128, axis=0)
    for i in range(128):
        keys[i, i // 8] ^= 1 << (i % 8)
    blocks = np.frombuffer(rng.randbytes(128 * 32), dtype=np.uint64).reshape(128, 2, 2).copy()
    assert (RowAes(keys).encrypt(blocks) == _expected(keys, blocks)).all()

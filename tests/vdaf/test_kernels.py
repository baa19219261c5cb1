"""The compiled kernels across processes: numba's on-disk cache must come
out usable when several processes start together on a fresh machine (the
leader, the helper and a client of ``veil demo``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Every kernel against Python ints; exits non-zero (or crashes) otherwise.
_EXERCISE = """
import numpy as np
from veil.vdaf.batch.field import VecField64 as F64, VecField128 as F128
from veil.vdaf.batch.kernels import kernels

for vf in (F64, F128):
    p = vf.MODULUS
    xs = [[(7 ** (i + 3 * j) + j) % p for i in range(5)] for j in range(3)]
    ys = [(p - 3 - 11 ** i) % p for i in range(5)]
    a, b = vf.from_ints(xs), vf.from_ints(ys)
    pairs = [list(zip(r, ys)) for r in xs]
    assert vf.to_ints(vf.mul(a, b)) == [[x * y % p for x, y in r] for r in pairs]
    assert vf.to_ints(vf.add(a, b)) == [[(x + y) % p for x, y in r] for r in pairs]
    assert vf.to_ints(vf.sub(a, b)) == [[(x - y) % p for x, y in r] for r in pairs]
    assert vf.to_ints(vf.dot(a, b)) == [sum(x * y for x, y in r) % p for r in pairs]
p = F128.MODULUS
row = [0, 1, p - 1, 5 ** 40 % p]
x = F128.from_ints([row])
e = F128.from_ints([[3 ** (i + j) % p for j in range(2)] for i in range(4)])
out = np.empty((4, 1, 2), np.int64)
kernels().matvec128(x, e, out)
want = [[sum(v * 3 ** (i + j) for i, v in enumerate(row)) % p for j in range(2)]]
assert F128.to_ints(out) == want
chunks = F128.from_ints([[[2, 3], [5, 7]]])  # 1 row, 2 calls, chunk 2
r, w = F128.from_ints([[11, 13]]), F128.from_ints([[17, 19]])
left, right = np.empty((4, 1, 2), np.int64), np.empty((4, 1, 2), np.int64)
kernels().chunk_wire_evals128(chunks, r, w, left, right)
assert F128.to_ints(left) == [[(17 * 11 * 2 + 19 * 13 * 5) % p, (17 * 121 * 3 + 19 * 169 * 7) % p]]
assert F128.to_ints(right) == [[17 * 2 + 19 * 5, 17 * 3 + 19 * 7]]
# The IDPF's kernels, with their calls into libcrypto (FIPS-197's AES-128).
from veil.vdaf.batch.aes import RowAes
key = np.frombuffer(bytes(range(16)), np.uint8).reshape(1, 16)
block = np.frombuffer(bytes.fromhex("00112233445566778899aabbccddeeff"), "<u8").reshape(1, 2)
hashed = RowAes(key).encrypt(block.astype(np.uint64)).astype("<u8").tobytes()
assert hashed.hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"
print("ok")
"""


def _run_together(count: int, env: dict[str, str]) -> list[tuple[int, str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _EXERCISE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(count)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


def test_processes_started_together_on_a_cold_cache(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONFAULTHANDLER": "1"}
    # Compiling at once, then loading what they left behind.
    for code, output in _run_together(3, env) + _run_together(2, env):
        assert code == 0 and output.strip().endswith("ok"), output[-2000:]
    assert any(tmp_path.rglob("*.nbc")), "numba cached nothing under NUMBA_CACHE_DIR"

"""The compiled kernels across processes: numba's on-disk cache must come
out usable when several processes start together on a fresh machine (the
leader, the helper and a client of ``veil demo``). The processes compile a
few probe kernels (tests/support/kernel_probe.py) through the loader veil's
kernels go through, rather than all of the field kernels (about 20 s of
compiling): the lock under test is the same, and each field kernel is
checked against Python ints or NumPy in tests/vdaf/batch/test_field.py
and test_xof.py. They also compile and load the IDPF's kernels, whose
calls into libcrypto must still work when loaded from the cache in a fresh
process."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[3]

# The probe kernels, loaded as veil loads its own, against Python ints;
# exits non-zero (or crashes) otherwise.
_EXERCISE = """
import numpy as np
from veil.vdaf.batch.kernels import load_compiled

k = load_compiled("tests.support.kernel_probe")
p = k.P64
xs, ys = [1, 2, p - 1, 5, 7 ** 20 % p], [3, p - 2, 7, 0, 11 ** 18 % p]
a, b = np.array(xs, np.uint64), np.array(ys, np.uint64)
assert [int(v) for v in k.add64(a, b)] == [(x + y) % p for x, y in zip(xs, ys)]
assert [int(v) for v in k.sub64(a, b)] == [(x - y) % p for x, y in zip(xs, ys)]
out = np.empty(len(xs), np.uint64)
k.double64(a, out)
assert [int(v) for v in out] == [2 * x % p for x in xs]
total = 0
for x, y in zip(xs, ys):
    total = (total + (x ^ y)) % p
assert int(k.xor_sum64(a, b)) == total
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
    # Twice on an empty cache: one run without the lock crashes about half the time.
    for attempt in range(2):
        cache = tmp_path / str(attempt)
        env = {
            **os.environ,
            "NUMBA_CACHE_DIR": str(cache),
            "PYTHONFAULTHANDLER": "1",
            "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        # Compiling at once, then loading what they left behind.
        for code, output in _run_together(3, env) + _run_together(2, env):
            assert code == 0 and output.strip().endswith("ok"), output[-2000:]
        assert any(cache.rglob("*.nbc")), "numba cached nothing under NUMBA_CACHE_DIR"


def test_each_kernel_module_stands_alone() -> None:
    # numba's cache is keyed on the file that defines a kernel: an inlined
    # helper or a constant imported from another module could change without
    # the cached machine code being rebuilt. So a kernel module imports
    # nothing but numba, NumPy and llvmlite.
    batch = _ROOT / "src" / "veil" / "vdaf" / "batch"
    modules = sorted(batch.glob("_*kernels.py"))
    assert len(modules) >= 4
    for path in modules:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." if node.level else (node.module or "").split(".")[0])
        assert imported <= {"numba", "numpy", "llvmlite"}, (path.name, imported)

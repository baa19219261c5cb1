"""Compiled elementwise kernels for the vectorised fields (``batch_field``).

NumPy evaluates a Field128 product as about forty whole-array passes (limb
products, carries, folds), each writing a temporary; a compiled loop keeps
one element in registers from its inputs to its result, several times
faster. The kernels are in three modules by concept, compiled by numba:
``veil.vdaf.batch._field128_kernels`` (Field128's arithmetic and the FLP's
loops over it), ``_field64_kernels`` and ``_xof_kernels`` (TurboSHAKE128).
They are imported on first use, so importing veil stays fast and only
processes that run the batched path pay for numba. numba keeps the machine
code in its on-disk cache (``cache=True``), so each machine compiles once.

Each kernel is a NumPy ufunc or generalised ufunc over scalar cores: NumPy
broadcasts the operands. The Field128 kernels take the four limbs of each
operand as separate arrays (``a[0] .. a[3]``), the layout of
``VecField128``. Inputs and results keep the invariants of ``batch_field``:
Field64 elements reduced; Field128 limbs in ``[0, 2^32)`` with values below
``2^128`` (weakly reduced).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernels:
    # Field128: eight limb arrays (a[0..3], b[0..3]) -> four result limbs.
    mul128: Any
    add128: Any
    sub128: Any
    # Field128: eight limb arrays with the summed axis last -> the eight
    # 32-bit-spaced column sums of the products (``VecField128._fold_columns``).
    dot128: Any
    # Field128: rows (4, R, K) times a matrix (4, K, J) into out (4, R, J),
    # zero entries skipped and small ones cheap (a compiled function, not a
    # ufunc: no broadcasting; all three C-contiguous).
    matvec128: Any
    # Field128: a prover's wire polynomials on the whole domain (seeds
    # (4, R, A), wires (4, R, A, C), any strides; the matrix (4, P, J),
    # where each column goes, out (4, R, A, D)); see _Extension.of_wires.
    extend128: Any
    # Field128: the same wires' ParallelSum(Mul) gadget polynomial, without
    # the wires on the domain (the last argument: out (4, R, G)).
    prove_mul_sum128: Any
    # Field128: four limb arrays -> the reduced representative's limbs.
    canonical128: Any
    # Field128: the chunked range check's wire values at the query point
    # (a compiled function writing into its last two arguments).
    chunk_wire_evals128: Any
    # Field128: the inverses 1 / (t - w^i) of a query point's differences
    # with the roots of unity, from t's powers and the root's inverse (a
    # compiled function writing into its last argument; see
    # flp._inverse_differences).
    inverse_differences128: Any
    # Field64: uint64 arrays.
    mul64: Any
    add64: Any
    sub64: Any
    dot64: Any  # sum of products along the last axis
    # TurboSHAKE128 of each row of a uint8 array (a compiled function:
    # messages (R, M), domain byte, out (R, N), both C-contiguous).
    turboshake128_rows: Any
    # Field64: inverse of each element of a 1-D uint64 array into another
    # (zero to zero; a compiled function, both C-contiguous).
    inv64_each: Any
    # Field128: the same for limbs (4, N) into (4, N), both C-contiguous.
    inv128_each: Any
    # Field128: the chunked range check's gadget inputs (x (4, R, L), read
    # as K chunks of M, zero padded,
    # joint rands (4, R, K), the constant's limbs, all-bits flag, out
    # (4, R, K, 2M); a compiled function).
    bit_check_wires128: Any
    # Field128 encoding: little-endian 32-bit words (R, 4N) to limbs
    # (4, R, N) and a below-p mask, and limbs back to words (compiled
    # functions writing into their last arguments).
    decode128: Any
    encode128: Any


_lock = threading.Lock()
_kernels: Kernels | None = None


def kernels() -> Kernels:
    """The compiled kernels, built (or loaded from numba's cache) on first use."""
    global _kernels
    if _kernels is None:
        with _lock:
            if _kernels is None:
                f128 = load_compiled("veil.vdaf.batch._field128_kernels")
                f64 = load_compiled("veil.vdaf.batch._field64_kernels")
                xof = load_compiled("veil.vdaf.batch._xof_kernels")
                _kernels = Kernels(
                    f128.mul128,
                    f128.add128,
                    f128.sub128,
                    f128.dot128,
                    f128.matvec128,
                    f128.extend128,
                    f128.prove_mul_sum128,
                    f128.canonical128,
                    f128.chunk_wire_evals128,
                    f128.inverse_differences128,
                    f64.mul64,
                    f64.add64,
                    f64.sub64,
                    f64.dot64,
                    xof.turboshake128_rows,
                    f64.inv64_each,
                    f128.inv128_each,
                    f128.bit_check_wires128,
                    f128.decode128,
                    f128.encode128,
                )
    return _kernels


_idpf: Any = None


def idpf_kernels() -> Any:
    """``veil.vdaf.batch._idpf_kernels`` (the IDPF walk's loops and the
    calls into libcrypto), compiled or loaded from numba's cache on first
    use, under the cache lock."""
    global _idpf
    if _idpf is None:
        with _lock:
            _idpf = load_compiled("veil.vdaf.batch._idpf_kernels")
    return _idpf


def load_compiled(name: str) -> ModuleType:
    """Import the module `name`, whose numba kernels (``cache=True``, explicit
    signatures) compile or load from numba's on-disk cache when it is
    imported, under the cache lock every process of this installation
    shares (see ``_cache_lock``)."""
    with _cache_lock():
        return importlib.import_module(name)


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    """Hold an exclusive lock shared by every process of this installation.

    numba's on-disk cache is not safe against processes that compile the
    same kernels at once: each writes its own machine code and index, and a
    process may then load a kernel whose wrapper points at another
    process's build, which crashes at the first call. The leader, the
    helper and a client started together on a fresh machine would do just
    that, so the import that compiles or loads the kernels takes turns."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): take the risk
        yield
        return
    candidates = [
        Path(__file__).with_name("__pycache__"),
        Path.home() / ".cache" / "veil",
    ]
    for directory in candidates:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle = open(directory / "kernels.lock", "a")  # noqa: SIM115
        except OSError:
            continue
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    log.warning("no writable place for the kernel cache lock; compiling without it")
    yield

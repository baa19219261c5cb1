"""Process-level tuning for throughput-bound veil processes (aggregator
workers, simulations, benchmarks). Call once at start-up; nothing in the
library calls it for you, because it changes process-wide state.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def tune_allocator(
    mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20, top_pad: int = 64 << 20
) -> bool:
    """Keep freed memory for reuse instead of returning it to the kernel.

    The batched VDAF path allocates and frees many arrays of 100 KiB to a
    few MiB per second. With glibc's defaults, arrays of 128 KiB and more
    are fresh ``mmap`` regions (or the heap top is trimmed and regrown), so
    each one costs page faults on first touch; on the benchmark machine this
    costs 20-30% of Field128 throughput. Raising the thresholds makes glibc
    recycle the memory. Peak RSS is unchanged; idle RSS stays at the peak
    (up to ``trim_threshold`` above it). Returns False (and does nothing)
    where glibc's ``mallopt`` is not available.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    ok &= mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    ok &= mallopt(_M_TOP_PAD, top_pad)
    return bool(ok)


_BLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def limit_blas_threads(threads: int = 1) -> bool:
    """Cap the threads of the OpenBLAS that NumPy loaded (as
    ``OPENBLAS_NUM_THREADS`` would before start-up).

    The batched path's GEMMs are small and many; OpenBLAS's worker threads
    then spend their time spinning, which doubled the prover's cost on the
    2-core benchmark machine, and more when other processes compete for the
    cores. Parallelism belongs one level up (worker processes, one per core).
    Returns False where no OpenBLAS is found (e.g. NumPy on Accelerate/MKL).
    """
    import numpy  # noqa: F401  (make sure its BLAS is loaded)

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return False
    done = False
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter.argtypes = [ctypes.c_int]
                setter.restype = None
                setter(threads)
                done = True
                break
    return done


def freeze_startup_heap() -> None:
    """Set aside everything alive now from the garbage collector's full
    passes: call once a server or worker has started, before its first job.

    CPython's full collection (generation 2) visits every tracked object of
    the process, and a started aggregator holds some hundreds of thousands
    (the modules of gRPC, protobuf, NumPy, numba, the database driver): 50
    to 75 ms a pass on the benchmark machine. An aggregation job's
    per-report objects live long enough to be promoted, so a full pass
    comes every few thousand reports, about 10 µs per Count report at the
    helper and at the worker (docs/reports/SCALING.md, issue 28). What is
    alive once start-up is over lives as long as the process: its garbage
    is collected once, the rest frozen (`gc.freeze`), and later full passes
    visit only what was made since.
    """
    gc.collect()
    gc.freeze()

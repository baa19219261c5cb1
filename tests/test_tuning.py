"""Process tuning (veil.tuning): each helper changes what it says it changes,
observed in a fresh process (the settings are process-wide)."""

from __future__ import annotations

import subprocess
import sys

# A 1 MiB malloc: with glibc's defaults it is an mmap region of its own;
# after tune_allocator (mmap threshold 32 MiB) it comes from the heap.
_MALLOC_PROBE = """
import ctypes, ctypes.util, sys
from veil.tuning import tune_allocator

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]

def in_heap(address):
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith("[heap]"):
                start, end = (int(x, 16) for x in line.split()[0].split("-"))
                if start <= address < end:
                    return True
    return False

before = in_heap(libc.malloc(1 << 20))
applied = tune_allocator() if sys.argv[1] == "tune" else False
after = in_heap(libc.malloc(1 << 20))
print(before, applied, after)
"""

_BLAS_PROBE = """
import ctypes, sys
import numpy
from veil.tuning import limit_blas_threads

threads = int(sys.argv[1])
applied = limit_blas_threads(threads)
with open("/proc/self/maps") as maps:
    path = next(line.split()[-1] for line in maps if "openblas" in line.lower())
lib = ctypes.CDLL(path)
for name in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
             "openblas_get_num_threads64_", "openblas_get_num_threads"):
    getter = getattr(lib, name, None)
    if getter is not None:
        break
getter.restype = ctypes.c_int
print(applied, getter())
"""


def _run(probe: str, arg: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", probe, arg], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_tune_allocator_keeps_large_blocks_in_the_heap() -> None:
    assert _run(_MALLOC_PROBE, "tune") == ["False", "True", "True"]
    # Control: without it the second block is an mmap region too.
    assert _run(_MALLOC_PROBE, "none") == ["False", "False", "False"]


def test_limit_blas_threads_sets_openblas_threads() -> None:
    assert _run(_BLAS_PROBE, "1") == ["True", "1"]
    assert _run(_BLAS_PROBE, "2") == ["True", "2"]


# Garbage from start-up (a reference cycle) is collected, everything alive
# is frozen, and a full collection afterwards visits only newer objects: its
# count of tracked objects in generation 2 starts from zero.
_FREEZE_PROBE = """
import gc, sys
import numpy
from veil.tuning import freeze_startup_heap

class Node:
    pass

garbage = Node()
garbage.self = garbage
alive = [Node() for _ in range(1000)]
del garbage
if sys.argv[1] == "freeze":
    freeze_startup_heap()
print(gc.get_freeze_count() > len(alive), len(gc.get_objects(generation=2)) < len(alive),
      any(type(o) is Node and getattr(o, "self", None) is o for o in gc.get_objects()))
"""


def test_freeze_startup_heap_collects_then_freezes() -> None:
    assert _run(_FREEZE_PROBE, "freeze") == ["True", "True", "False"]
    # Control: nothing frozen, the start-up objects stay in the collected generations.
    assert _run(_FREEZE_PROBE, "none") == ["False", "False", "True"]

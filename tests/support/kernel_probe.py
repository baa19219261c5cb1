"""A few numba kernels of each kind veil.vdaf.batch's field kernels have (ufunc,
generalised ufunc, compiled function; cache=True, explicit signatures,
inlined helpers), small enough to compile in a second: tests/vdaf/batch/test_kernels.py
compiles them in processes started together on an empty cache, through
veil.vdaf.batch.kernels.load_compiled as veil's own kernels are. Without the
lock there, those processes crash (a kernel loaded from another process's
build) in about half the runs."""

import numba as nb
import numpy as np

P64 = 0xFFFFFFFF00000001
_U64 = np.uint64
_P = _U64(P64)


@nb.njit(inline="always")
def _add(a, b):
    s = a + b
    if s < a or s >= _P:
        s -= _P
    return s


@nb.vectorize(["uint64(uint64, uint64)"], cache=True)
def add64(a, b):
    return _add(a, b)


@nb.vectorize(["uint64(uint64, uint64)"], cache=True)
def sub64(a, b):
    return _add(a, _P - b) if b else a


@nb.guvectorize(["void(uint64[:], uint64[:], uint64[:])"], "(n),(n)->()", cache=True)
def xor_sum64(a, b, out):
    acc = _U64(0)
    for i in range(a.shape[0]):
        acc = _add(acc, a[i] ^ b[i])
    out[0] = acc


@nb.njit("void(uint64[::1], uint64[::1])", cache=True)
def double64(a, out):
    for i in range(a.shape[0]):
        out[i] = _add(a[i], a[i])

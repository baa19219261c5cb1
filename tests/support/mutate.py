"""Byte mutations for the fuzz tests (decoders, RPC handlers): a hypothesis
strategy of edit lists and the function that applies one."""

from __future__ import annotations

from hypothesis import strategies as st

# (kind, position, value): 0 flips a bit, 1 truncates, 2 appends a run of a
# byte, 3 overwrites a byte.
mutations = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 255)), max_size=4
)


def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, pos, val in ops:
        if kind == 0 and out:
            out[pos % len(out)] ^= 1 << (val % 8)
        elif kind == 1:
            out = out[: pos % (len(out) + 1)]
        elif kind == 2:
            out += bytes([val % 256]) * (1 + pos % 40)
        elif kind == 3 and out:
            out[pos % len(out)] = val % 256
    return bytes(out)

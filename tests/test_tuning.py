"""Process tuning helpers: safe to call, report whether they applied."""

from __future__ import annotations

from veil.tuning import limit_blas_threads, tune_allocator


def test_tuning_helpers_return_a_flag() -> None:
    assert isinstance(tune_allocator(), bool)
    assert isinstance(limit_blas_threads(1), bool)

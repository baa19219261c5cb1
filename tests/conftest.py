"""Shared test configuration: the official VDAF test vectors, the throwaway PostgreSQL."""

from __future__ import annotations

import compileall
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import veil
from bench.postgres import DSN_ENV, find_pg_bin, postgres_dsn, with_schema
from tests.support.backends import KINDS, Backend
from tests.support.vectors import vectors_dir
from veil.local.launcher import share_ports

# CI replays the same examples every run, so a landing is never decided by a
# random draw; developers' runs (and VEIL_TEST_LONG) explore new ones.
# No example has a deadline: a test asserts no timing (the benchmarks measure
# time), and a loaded machine made one slow example fail as "flaky".
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# Files that run real servers for long (these folders, these markers) are
# collected first: the parallel workers (pytest-xdist, a file at a time each)
# start them early, so that no long file is left to run alone at the end.
_LONG_MARKERS = ("slow", "fault", "load", "browser")
_LONG_FOLDERS = ("reliability", "integration", "docs", "web", "js")


def pytest_configure(config: pytest.Config) -> None:
    """Before the parallel workers start, compile veil's field kernels (or
    load them from numba's cache) once, in a process of its own. On a fresh
    installation the first process to need them compiles them for a minute
    and more on a busy machine, holding the cache lock every other process
    waits on; left to the tests, that was a respondent inside some survey's
    window, which closed before it had sent anything."""
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        # Each worker draws its servers' ports from a part of the range of its own.
        share_ports(int(worker["workerid"].removeprefix("gw")), int(worker["workercount"]))
        return
    # The suite starts `veil` processes by the hundred. An editable install's
    # modules have no bytecode until an import writes it, and none ever does
    # where PYTHONDONTWRITEBYTECODE is set (as on CI's machines): each process
    # then compiled every veil module it imported from source, 0.25 of its
    # 0.8 CPU-s of imports. Compiled once here, they are read by every process
    # (the variable stops writing, not reading).
    compileall.compile_dir(Path(veil.__file__).parent, quiet=1)
    if config.getoption("dist", "no") == "no":
        return
    warm = "from veil.vdaf.batch import kernels as k; k.kernels(); k.idpf_kernels()"
    subprocess.run([sys.executable, "-c", warm], check=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): three workers per core. Much of the
    suite's time is spent waiting (for servers to start, for a crash's
    restart, and when this was measured for survey windows to close, which
    the survey tests now close themselves): one worker per core left the
    cores half idle (14 minutes against 8 with two per core in one CI
    rehearsal), and with two per core they were still idle 11% of a quiet
    run, in stretches of 30 s at 40% where every worker waited on a window."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 3 * (cores or 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    long_files = {
        item.path
        for item in items
        if any(item.get_closest_marker(m) for m in _LONG_MARKERS)
        or item.path.relative_to(tests).parts[0] in _LONG_FOLDERS
    }
    items.sort(key=lambda item: item.path not in long_files)  # stable: files stay whole


@pytest.fixture(scope="session")
def vdaf_vectors() -> Path:
    """The official vectors' directory. Where it is missing the tests that
    need it skip, saying why; under CI they fail, so CI never passes without
    having checked every vector."""
    path = vectors_dir()
    if path is None:
        reason = (
            "official VDAF test vectors not found: set VEIL_VDAF_VECTORS, or put in one"
            " directory ../shared/vdaf-test-vectors the files test_vec/vdaf/Prio3*.json,"
            " test_vec/vdaf/Poplar1*.json, test_vec/Xof*.json and"
            " test_vec/IdpfBBCGGI21_0.json of github.com/cfrg/draft-irtf-cfrg-vdaf (tag"
            " draft-irtf-cfrg-vdaf-20)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One throwaway PostgreSQL for the whole session (or VEIL_TEST_POSTGRES_DSN).

    Where PostgreSQL is missing the tests that need it skip, saying why;
    under CI (the CI variable set) they fail instead, so CI never passes
    without having run them.
    """
    if not os.environ.get(DSN_ENV) and find_pg_bin() is None:
        reason = (
            f"PostgreSQL not found (no initdb/pg_ctl on PATH or in /usr/lib/postgresql)"
            f" and {DSN_ENV} unset: install the 'postgresql' package"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    with postgres_dsn() as dsn:
        yield dsn


@pytest.fixture
def postgres(postgres_server: str) -> str:
    """A DSN whose tables live in a fresh schema of their own (one per test)."""
    return with_schema(postgres_server, "t_" + secrets.token_hex(6))


@pytest.fixture(
    params=[k if k == "sqlite" else pytest.param(k, marks=pytest.mark.postgres) for k in KINDS]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The suite's one storage fixture: each test that takes it runs on SQLite
    and on a real PostgreSQL (marked `postgres`)."""
    dsn = None if request.param == "sqlite" else request.getfixturevalue("postgres_server")
    b = Backend(tmp_path, dsn)
    yield b
    b.close()

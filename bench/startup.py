"""What starting the `veil` command costs (scripts/bench_startup.py prints the
table): the CPU time (user + system, the operating system's accounting of
the finished child) of one `python -m veil.cli ...` process per command,
the median of N starts after one warm-up start each.

The test suite starts hundreds of these processes, so their start-up is a
large part of its CPU. The commands measured:

- `--version`, `--help` and `survey respond --help`: the parser alone;
- `survey deploy` of a two-question survey (each start writes a new
  directory);
- `leader` and `helper`, from start to the health check's SERVING (the
  process is killed at that moment, so what is counted is the start);
- `survey status` and `survey respond` (one respondent, two answers) against
  those servers running.

Given a second source tree (`vs`, a checkout's src/ directory put first on
the children's PYTHONPATH), each command's starts alternate between the two,
A B A B, so that a drift in the machine's speed falls on both alike.
"""

from __future__ import annotations

import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from veil.local.launcher import ServerProcess, free_port
from veil.times import format_time

SURVEY = """\
[survey]
name = "Start-up benchmark"
epsilon = 1
min_batch_size = 1
max_respondents = 1000
time_precision = 3600
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "remote"
text = "Do you work remotely most days?"
kind = "yes_no"

[[question]]
id = "team"
text = "Which team are you in?"
kind = "choice"
options = ["engineering", "design", "sales"]
"""

ROWS = (
    "veil --version",
    "veil --help",
    "veil survey respond --help",
    "veil survey deploy",
    "veil helper (start to serving)",
    "veil leader (start to serving)",
    "veil survey status",
    "veil survey respond",
)


@dataclass(frozen=True)
class Row:
    command: str
    cpu_s: list[float]  # one figure a counted start
    vs_cpu_s: list[float] | None = None  # the same starts of the other tree

    @property
    def median(self) -> float:
        return statistics.median(self.cpu_s)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _veil(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "veil.cli", *map(str, args)]


def _env(source: Path | None) -> dict[str, str]:
    """What a child gets on top of our environment: the warning about
    plaintext on loopback silenced, as a user would; `source` first on its path."""
    env = {"VEIL_LOG_LEVEL": "error"}
    if source is not None:
        path = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([str(source), *([path] if path else [])])
    return env


def cpu_of_run(argv: Sequence[str], source: Path | None = None) -> float:
    """CPU seconds of one process running `argv` to its end (it must succeed)."""
    before = _children_cpu()
    done = subprocess.run(argv, capture_output=True, env={**os.environ, **_env(source)})
    after = _children_cpu()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]!r}")
    return after - before


def cpu_of_server_start(server: ServerProcess, source: Path | None = None) -> float:
    """CPU seconds of one server process from its start to SERVING: it is
    killed as soon as it serves and reaped, so its accounting stops there."""
    server.env = _env(source)
    before = _children_cpu()
    server.start()
    server.stop(signal.SIGKILL)
    return _children_cpu() - before


def _sample(name: str, starts: int, once: Callable[[Path | None], float], vs: Path | None) -> Row:
    """`starts` counted starts after a warm-up (the first start also fills
    the file caches); with `vs`, each followed by one of the other tree."""
    sources: list[Path | None] = [None] if vs is None else [None, vs]
    for source in sources:
        once(source)
    figures: list[list[float]] = [[] for _ in sources]
    for _ in range(starts):
        for source, column in zip(sources, figures, strict=True):
            column.append(once(source))
    return Row(name, figures[0], figures[1] if vs is not None else None)


def measure(starts: int = 5, rows: Sequence[str] = ROWS, vs: Path | None = None) -> list[Row]:
    """The rows named in `rows` (all of ROWS by default), `starts` counted
    starts each, in ROWS order; with `vs`, as many of that source tree's."""
    unknown = set(rows) - set(ROWS)
    if unknown:
        raise ValueError(f"unknown rows: {sorted(unknown)}")
    results: dict[str, Row] = {}
    with tempfile.TemporaryDirectory(prefix="veil-startup-") as tmp:
        root = Path(tmp)
        now = int(time.time())
        hour = now - now % 3600
        survey = root / "survey.toml"
        survey.write_text(
            SURVEY.format(opens=format_time(hour - 3600), closes=format_time(hour + 2 * 86400))
        )
        leader = f"127.0.0.1:{free_port()}"
        helper = f"127.0.0.1:{free_port()}"
        deployed = iter(range(1_000_000))

        def deploy(source: Path | None) -> float:
            out = root / f"out{next(deployed)}"
            return cpu_of_run(
                _veil(
                    "survey", "deploy", "--survey", survey, "--out", out,
                    "--leader", leader, "--helper", helper, "--no-tls",
                ),
                source,
            )  # fmt: skip

        for name, argv in (
            ("veil --version", _veil("--version")),
            ("veil --help", _veil("--help")),
            ("veil survey respond --help", _veil("survey", "respond", "--help")),
        ):
            if name in rows:
                results[name] = _sample(name, starts, partial(cpu_of_run, argv), vs)
        if "veil survey deploy" in rows:
            results["veil survey deploy"] = _sample("veil survey deploy", starts, deploy, vs)
        if any(r in rows for r in ROWS[4:]):
            deploy(None)
            out = root / "out0"
            servers = {
                role: ServerProcess(
                    role, out / role / f"{role}.toml", root / f"{role}.log", address
                )
                for role, address in (("helper", helper), ("leader", leader))
            }
            for role, server in servers.items():
                name = f"veil {role} (start to serving)"
                if name in rows:
                    results[name] = _sample(name, starts, partial(cpu_of_server_start, server), vs)
            try:
                for server in servers.values():
                    server.start()
                status = _veil("survey", "status", "--survey-dir", out / "collector")
                respond = _veil(
                    "survey", "respond", "--survey-dir", out / "client", "--no-progress",
                    "--answer", "remote=yes", "--answer", "team=design",
                )  # fmt: skip
                for name, argv in (
                    ("veil survey status", status),
                    ("veil survey respond", respond),
                ):
                    if name in rows:
                        results[name] = _sample(name, starts, partial(cpu_of_run, argv), vs)
            finally:
                for server in servers.values():
                    server.stop()
    return [results[name] for name in ROWS if name in results]


def format_table(rows: Sequence[Row]) -> str:
    """One line a command: the median CPU seconds of a start, its min and max;
    with the other tree's starts, its median and the median of the ratios
    this / other, start by start."""
    compared = any(r.vs_cpu_s is not None for r in rows)
    head = f"{'command (CPU s a start)':<34} {'median':>7} {'min':>6} {'max':>6}"
    if compared:
        head += f" {'vs':>7} {'ratio':>6}"
    lines = [head]
    for r in rows:
        line = f"{r.command:<34} {r.median:7.3f} {min(r.cpu_s):6.3f} {max(r.cpu_s):6.3f}"
        if r.vs_cpu_s is not None:
            ratio = statistics.median(a / b for a, b in zip(r.cpu_s, r.vs_cpu_s, strict=True))
            line += f" {statistics.median(r.vs_cpu_s):7.3f} {ratio:6.2f}"
        lines.append(line)
    return "\n".join(lines)

"""py-spy sampling server processes while a benchmark measures them: a flame
graph and collapsed stacks per process (`scripts/bench_workers.py --profile`,
`scripts/bench_text.py --profile`)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


class Profiler:
    """py-spy sampling the given processes (their Python stacks) while it is
    open, one flame graph (SVG) and one collapsed-stack file (text) per
    process in `directory`; does nothing without `directory`."""

    def __init__(self, directory: Path | None, label: str, procs: dict[str, int | None]) -> None:
        self.running: list[subprocess.Popen[bytes]] = []
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        for name, pid in procs.items():
            if pid is None:
                continue
            stem = directory / f"{label}-{name.split(' (')[0].replace(' ', '')}"
            for fmt, suffix in (("flamegraph", ".svg"), ("raw", ".txt")):
                self.running.append(
                    subprocess.Popen(
                        [
                            "py-spy",
                            "record",
                            "--nonblocking",
                            # Only the thread holding the GIL: CPU, not waits.
                            "--gil",
                            "--rate",
                            "250",
                            "--format",
                            fmt,
                            "--pid",
                            str(pid),
                            "--output",
                            str(stem) + suffix,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )

    def stop(self) -> None:
        for p in self.running:
            p.send_signal(signal.SIGINT)
        for p in self.running:
            p.wait(timeout=60)

"""The signals a running aggregator or worker takes: SIGTERM and SIGINT stop
it, SIGHUP loads the task files added to its config."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from veil.aggregator.run.config import ConfigError
from veil.task import AggregatorTask, TaskError

log = logging.getLogger(__name__)


class Signals:
    """SIGTERM and SIGINT (stop) and, with a config path, SIGHUP (load task
    files added to it), caught from construction on. Made before a server
    reports SERVING, so that a signal sent as soon as it does is never met
    by the default action (which would kill it on the spot)."""

    def __init__(self, config_path: Path | None) -> None:
        self.config_path = config_path
        # Flags say what came; `_woken` says something did. wait() clears
        # `_woken` before it reads the flags, so a signal that comes while it
        # reloads wakes it again rather than being lost.
        self._woken = threading.Event()
        self._stop = threading.Event()
        self._reload = threading.Event()
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        if config_path is not None:
            signal.signal(signal.SIGHUP, self._on_hangup)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()
        self._woken.set()

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self._reload.set()
        self._woken.set()

    def wait(self, on_reload: Callable[[Path], list[AggregatorTask]]) -> None:
        """Block until SIGTERM or SIGINT; on SIGHUP call `on_reload`, in this
        (the main) thread, and log what it added. A stop wins over a reload
        that has not started."""
        while True:
            self._woken.wait()
            self._woken.clear()
            if self._stop.is_set():
                return
            if not self._reload.is_set():
                continue
            self._reload.clear()
            assert self.config_path is not None
            try:
                added = on_reload(self.config_path)
                log.info(
                    "SIGHUP: %d new task(s) served: %s",
                    len(added),
                    ", ".join(t.id_text for t in added) or "none",
                )
            except (ConfigError, TaskError, ValueError) as e:
                log.error("SIGHUP: tasks not reloaded: %s", e)

"""The signals a running aggregator or worker takes: SIGTERM and SIGINT stop
it, SIGHUP loads the task files added to its config."""

from __future__ import annotations

import logging
import signal
import socket
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
    by the default action (which would kill it on the spot).

    The kernel hands a signal sent to the process to any one of its threads
    that does not block it, and Python runs the handler only when the main
    thread next runs bytecode. A main thread asleep on a lock is woken only
    by a signal the kernel gave to it: one taken by a gRPC, database or
    driver thread waited, unseen, for the next signal that reached the main
    thread (a server went on refusing a task it had been sent SIGHUP for,
    until SIGTERM, when the stop won). So the main thread sleeps on a
    socket that Python's own low-level handler writes to whichever thread
    runs it (`signal.set_wakeup_fd`)."""

    def __init__(self, config_path: Path | None) -> None:
        self.config_path = config_path
        # What came, set by the handlers (in the main thread) and read by
        # wait(): plain flags, no lock, since a handler runs between two
        # bytecodes of the main thread, which may hold any lock it takes.
        self._stop = False
        self._reload = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        if config_path is not None:
            signal.signal(signal.SIGHUP, self._on_hangup)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self._reload = True

    def _sleep(self) -> None:
        """Until a signal comes (to any thread). The handlers have run when
        this returns: the low-level handler marks them for the main thread
        before it writes the wake-up byte, and Python runs them before the
        next bytecode after this call."""
        self._wake_r.setblocking(True)
        try:
            self._wake_r.recv(64)
        finally:
            self._wake_r.setblocking(False)
        # Bytes of signals already acted on, so that the next sleep waits.
        try:
            while self._wake_r.recv(64):
                pass
        except BlockingIOError:
            pass

    def wait(self, on_reload: Callable[[Path], list[AggregatorTask]]) -> None:
        """Block until SIGTERM or SIGINT; on SIGHUP call `on_reload`, in this
        (the main) thread, and log what it added. A stop wins over a reload
        that has not started."""
        try:
            while True:
                if self._stop:
                    return
                if not self._reload:
                    self._sleep()
                    continue
                # Cleared before the reload, so that a SIGHUP that comes
                # while it runs is acted on again after it.
                self._reload = False
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
        finally:
            self.close()

    def close(self) -> None:
        """Give the wake-up back to whoever had it (wait() does on its way out)."""
        if self._wake_r.fileno() == -1:
            return
        signal.set_wakeup_fd(self._previous_fd)
        self._wake_r.close()
        self._wake_w.close()

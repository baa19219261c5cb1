"""veil.aggregator.run.signals: how a running server takes its signals (the
servers themselves, as processes: tests/integration)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from veil.aggregator.run.signals import Signals
from veil.task import AggregatorTask


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _send_later(sig: int) -> None:
    threading.Timer(0.05, os.kill, (os.getpid(), sig)).start()


@pytest.mark.usefixtures("restore_handlers")
def test_signals_are_caught_from_construction_on(tmp_path: Path) -> None:
    # Sent before wait() is called (as a test does the moment a server
    # reports SERVING): caught, not the default action, and acted on.
    config = tmp_path / "server.toml"
    signals = Signals(config)
    os.kill(os.getpid(), signal.SIGHUP)
    reloads: list[Path] = []

    def on_reload(path: Path) -> list[AggregatorTask]:
        reloads.append(path)
        _send_later(signal.SIGTERM)
        return []

    signals.wait(on_reload)
    assert reloads == [config]


@pytest.mark.usefixtures("restore_handlers")
def test_a_failed_reload_is_logged_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signals = Signals(tmp_path / "server.toml")
    calls = 0

    def on_reload(path: Path) -> list[AggregatorTask]:
        nonlocal calls
        calls += 1
        if calls == 1:
            _send_later(signal.SIGHUP)
            raise ValueError("a broken task file")
        _send_later(signal.SIGINT)
        return []

    os.kill(os.getpid(), signal.SIGHUP)
    signals.wait(on_reload)
    assert calls == 2
    assert "SIGHUP: tasks not reloaded: a broken task file" in caplog.text


@pytest.mark.usefixtures("restore_handlers")
def test_a_stop_is_not_lost_behind_a_reload(tmp_path: Path) -> None:
    # Both came before wait() looked: it stops, without reloading. (When
    # the stop was folded into the reload's wake-up, it was cleared with it
    # and the server went on until another signal.)
    signals = Signals(tmp_path / "server.toml")
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGTERM)
    reloads: list[Path] = []

    def on_reload(path: Path) -> list[AggregatorTask]:
        reloads.append(path)
        return []

    # If the stop were lost, this later one would end the wait (a failure,
    # not a hang).
    safety = threading.Timer(5.0, os.kill, (os.getpid(), signal.SIGTERM))
    safety.start()
    began = time.monotonic()
    try:
        signals.wait(on_reload)
    finally:
        safety.cancel()
    assert time.monotonic() - began < 4.0
    assert reloads == []


@pytest.mark.usefixtures("restore_handlers")
def test_without_a_config_path_sighup_is_left_alone() -> None:
    before = signal.getsignal(signal.SIGHUP)
    Signals(None).close()
    assert signal.getsignal(signal.SIGHUP) is before


@pytest.mark.usefixtures("restore_handlers")
def test_a_signal_taken_by_another_thread_wakes_the_wait(tmp_path: Path) -> None:
    # The kernel gives a signal sent to the process to any one of its
    # threads that does not block it. Taken by a thread other than the main
    # one (here a thread of the driver's kind, asleep on an event), Python
    # runs the handler only when the main thread next runs bytecode: a wait
    # asleep on a lock never woke, and the reload waited for the next signal
    # that happened to reach the main thread (SIGTERM: then the stop won).
    config = tmp_path / "server.toml"
    signals = Signals(config)
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, name="driver")
    other.start()
    assert other.ident is not None
    reloads: list[Path] = []

    def on_reload(path: Path) -> list[AggregatorTask]:
        reloads.append(path)
        signal.pthread_kill(other.ident, signal.SIGTERM)  # type: ignore[arg-type]
        return []

    # If the wait never wakes, this ends it from the main thread (a failure,
    # not a hang).
    main = threading.main_thread().ident
    assert main is not None
    safety = threading.Timer(5.0, signal.pthread_kill, (main, signal.SIGTERM))
    safety.start()
    began = time.monotonic()
    try:
        threading.Timer(0.05, signal.pthread_kill, (other.ident, signal.SIGHUP)).start()
        signals.wait(on_reload)
    finally:
        safety.cancel()
        idle.set()
        other.join()
    assert reloads == [config]
    assert time.monotonic() - began < 4.0

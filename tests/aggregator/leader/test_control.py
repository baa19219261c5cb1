"""veil.aggregator.leader.control: the driver's stop and helper-unreachable
events across threads, and the retry backoff's bounds."""

from __future__ import annotations

import threading
import time

from veil.aggregator.leader.control import Backoff, DriverControl


def test_a_stop_from_another_thread_ends_the_drivers_wait() -> None:
    control = DriverControl()
    assert not control.stopping
    threading.Timer(0.05, control.stop).start()
    began = time.monotonic()
    assert control.wait(30.0)  # woken by the stop, long before the 30 s
    assert control.stopping and time.monotonic() - began < 25.0


def test_the_servers_own_event_stops_the_driver() -> None:
    event = threading.Event()
    control = DriverControl(event)
    event.set()
    assert control.stopping and control.wait(0.0)


def test_helper_unreachable_lasts_until_the_next_pass() -> None:
    control = DriverControl()
    assert not control.helper_unreachable
    control.helper_away("call to helper failed", "grpc h:1")
    assert control.helper_unreachable
    assert (control.away_because, control.away_helper) == ("call to helper failed", "grpc h:1")
    control.begin_pass()
    assert not control.helper_unreachable
    # Said of the last pass only.
    assert (control.away_because, control.away_helper) == ("", None)
    control.helper_away("refused for now")
    assert (control.away_because, control.away_helper) == ("refused for now", None)
    assert not control.wait(0.0)  # not a stop


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    backoff = Backoff(first=1.0, most=300.0)
    for failures, full in ((1, 1.0), (2, 2.0), (5, 16.0), (9, 256.0), (10, 300.0), (500, 300.0)):
        delays = [backoff(failures) for _ in range(200)]
        assert all(0.5 * full <= d < 1.5 * full for d in delays), (failures, delays)
        assert len(set(delays)) > 1  # jittered: retries do not come in step

"""The aggregators' clocks apart: the helper runs 300 s behind, then 300 s
ahead of the leader, with Debian's libfaketime preloaded into the helper's
process only (the leader, the clients and the collector keep the real time).

Every report the leader acknowledged is collected, and the skew is shown:
`veil status` (read by the real CLI), the leader's metric and its log. With
the helper behind, the reports it finds too early wait at the leader and go
again once its clock has caught up (issue 26: 200 acknowledged, 0 collected).
With the helper ahead, a report it would drop as expired is refused at upload
once the leader has read the helper's clock.

Needs faketime (`.ci/run` installs Debian's `faketime`); skips without it,
except under CI, where it fails.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployment import Deployment
from tests.support.reliability import record
from veil.client import UploadError
from veil.local.launcher import LocalDeployment
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fault]

SKEW = 300
TP = 10
# Under SKEW: with the helper SKEW s behind, a report stamped now is too early
# for it for about SKEW - MAX_CLOCK_SKEW seconds (then taken).
MAX_CLOCK_SKEW = 290
PER_BUCKET = 100
WAIT = 120.0
# How much further ahead the late bucket is when the helper is behind: the
# time the test has to see its reports wait at the leader.
LOOKOUT = 60
# Reports expire after EXPIRY s; one OLD s old is within that by the leader's
# clock, and beyond it by the clock of a helper SKEW s ahead.
EXPIRY = 3600
OLD = 3500


def _libfaketime() -> str:
    """The multithreaded libfaketime (the servers run gRPC threads)."""
    found = sorted(
        glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
        + glob.glob("/usr/lib/faketime/libfaketimeMT.so.1")
    )
    if not found or shutil.which("faketime") is None:
        reason = "libfaketime not found: install Debian's faketime"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found[0]


def _faketime(offset: int) -> dict[str, str]:
    """The environment that sets a process's clock `offset` seconds apart.
    The monotonic clock stays true: deadlines and timers are not shifted."""
    return {
        "LD_PRELOAD": _libfaketime(),
        "FAKETIME": f"{offset:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@pytest.fixture(params=[-SKEW, SKEW], ids=["helper_behind", "helper_ahead"])
def skewed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Deployment, int]]:
    offset: int = request.param
    task: dict[str, Any] = {
        "time_precision": TP,
        "min_batch_size": 1,
        "max_clock_skew": MAX_CLOCK_SKEW,
        "report_expiry_age": EXPIRY,
    }
    local = LocalDeployment.start(
        tmp_path,
        {"skew": (VdafSpec("count"), DpSpec("none"), task)},
        metrics=True,
        env={"helper": _faketime(offset)},
    )
    dep = Deployment(local)
    try:
        yield dep, offset
    finally:
        dep.stop()


def _status(dep: Deployment) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "veil.cli", "status", "--config", str(dep.leader.config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def _metric_offset(dep: Deployment) -> float:
    assert dep.leader.metrics_address is not None
    with urllib.request.urlopen(f"http://{dep.leader.metrics_address}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r'veil_helper_clock_offset_seconds{helper="[^"]+"} (\S+)', text)
    assert len(found) == 1, text
    return float(found[0])


def test_every_acknowledged_report_is_collected_with_the_clocks_apart(
    skewed: tuple[Deployment, int],
) -> None:
    dep, offset = skewed
    began = time.monotonic()
    # One bucket ahead of the leader's clock, one a minute back (taken at
    # once). With the helper SKEW s behind, the late bucket is too early for
    # it until the leader's clock passes late + SKEW - MAX_CLOCK_SKEW: the
    # wait the test watches for. Just ahead (10 to 20 s of waiting) was not
    # long enough for the leader's first job and status to come beside a
    # whole suite and two busy loops; a minute further ahead is.
    ahead = LOOKOUT if offset < 0 else 0
    late = (int(time.time() + ahead) // TP + 1) * TP
    early = late - ahead - 6 * TP
    client = dep.client("skew")
    acknowledged = 0
    for t in (late, early):
        acknowledged += client.upload_batch([1] * PER_BUCKET, t).accepted
    assert acknowledged == 2 * PER_BUCKET

    # The leader has read the helper's clock from its first job's answer.
    deadline = time.monotonic() + WAIT
    while not (status := _status(dep))["helper_clocks"]:
        assert time.monotonic() < deadline, "no reading of the helper's clock"
        time.sleep(0.2)
    (clock,) = status["helper_clocks"]
    assert clock["helper"] == dep.helper.address
    assert abs(clock["offset_seconds"] - offset) < 5, clock
    assert abs(_metric_offset(dep) - offset) < 5
    waiting = status["tasks"][0]["waiting_for_helper_clock"]
    if offset < 0:
        # The late bucket waits at the leader; nothing was rejected.
        deadline = time.monotonic() + WAIT
        while waiting < PER_BUCKET:
            assert time.monotonic() < deadline, f"{waiting} reports wait for the helper"
            time.sleep(0.2)
            waiting = _status(dep)["tasks"][0]["waiting_for_helper_clock"]
        assert waiting == PER_BUCKET
    else:
        assert waiting == 0
    # Now that the leader knows the helper's clock: a report the helper
    # would drop as expired is refused at upload, not acknowledged.
    old = (int(time.time()) - OLD) // TP * TP
    if offset > 0:
        with pytest.raises(UploadError, match="by the helper's clock, which is ahead"):
            client.upload_batch([1], old)
    else:
        acknowledged += client.upload_batch([1], old).accepted

    with dep.collector("skew") as collector:
        result = collector.collect(old, late + TP - old, wait=WAIT + LOOKOUT)
    assert (result.report_count, result.estimate) == (acknowledged, acknowledged)
    assert dep.rejections("leader", "skew") == {}
    assert dep.rejections("helper", "skew") == {}
    status = _status(dep)
    assert status["tasks"][0]["waiting_for_helper_clock"] == 0
    assert "skew" not in status["tasks"][0]["rejections"]
    side = "behind" if offset < 0 else "ahead of"
    log = dep.leader.log.read_text()
    warned = re.search(rf"WARNING .* the helper at \S+ is (\S+) s {side} the leader's", log)
    assert warned is not None, log[-3000:]
    assert abs(float(warned.group(1)) - SKEW) < 5
    record(
        "clock_skew",
        helper_offset_s=offset,
        measured_offset_s=clock["offset_seconds"],
        acknowledged=acknowledged,
        collected=result.report_count,
        waited_for_helper=PER_BUCKET if offset < 0 else 0,
        seconds=round(time.monotonic() - began, 1),
    )

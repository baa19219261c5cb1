"""veil.aggregator.leader.dap_client: the leader's token goes to the helper
the task names, nowhere else. A deferred answer's Location on another
origin or outside the resource asked is refused before anything more is
sent, and a redirect is not followed: a helper on loopback answering what
the test tells it to (a real HTTP server), and a second one recording
whether it was ever called."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dap.scripted_server import Answer, ScriptedServer
from veil.aggregator.errors import InvalidMessage
from veil.aggregator.leader.dap_client import DapHelperClient
from veil.dap.jobs import AggregateShare
from veil.dap.problems import media_type
from veil.dap.versions import DapVersion
from veil.hpke import Ciphertext
from veil.task import DapSpec, DpSpec, LeaderTask, VdafSpec, new_task

TP = 3600
SHARE = Ciphertext(7, b"e" * 32, b"sealed share")


@pytest.fixture
def helper() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


@pytest.fixture
def elsewhere() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    yield server
    server.close()


def _task(helper: ScriptedServer) -> LeaderTask:
    dap = DapSpec("http://127.0.0.1:9/", helper.url, DapVersion.DAP_19.value, "veil")
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none"),
        dap=dap,
    )  # fmt: skip
    return files.leader


def _ask(task: LeaderTask) -> Ciphertext:
    return DapHelperClient(timeout=10).aggregate_share(
        task, bytes(16), 480_000 * TP, TP, 1, bytes(32)
    )


def test_a_deferred_share_is_polled_only_below_its_resource_at_the_helper(
    helper: ScriptedServer, elsewhere: ScriptedServer
) -> None:
    task = _task(helper)
    resource = f"/tasks/{task.id_text}/aggregate_shares"
    port = helper.url.rsplit(":", 1)[1].rstrip("/")
    for location in (
        f"{elsewhere.url}{resource[1:]}/1",  # another port
        f"//{elsewhere.url.split('//', 1)[1]}{resource[1:]}/1",  # protocol-relative
        f"http://localhost:{port}{resource}/1",  # another host name
        f"https://127.0.0.1:{port}{resource}/1",  # another scheme
        f"/tasks/{task.id_text}/aggregation_jobs/1",  # another resource
        "/tasks/AAAA/aggregate_shares/1",  # another task
        resource,  # the creation URL, not a share
        f"{resource}/%2e%2e/%2e%2e/x",
    ):
        helper.answers = [Answer(200, headers={"Location": location, "Retry-After": "0"})]
        helper.seen.clear()
        with pytest.raises(InvalidMessage) as refused:
            _ask(task)
        assert f"deferred its aggregate_shares answer: the Location {location!r}" in str(
            refused.value
        )
        assert [m for m, _, _, _ in helper.seen] == ["POST"], location
    # A redirect of the request: not followed, and its Location is as
    # refused as a deferred answer's.
    for status in (301, 302, 303, 307, 308):
        helper.answers = [
            Answer(status, headers={"Location": f"{elsewhere.url}x", "Retry-After": "0"})
        ]
        with pytest.raises(InvalidMessage, match="is not on"):
            _ask(task)
    assert elsewhere.seen == []
    # Control: a Location below the resource at the helper is polled, with
    # the task's token, and its answer taken.
    share = Answer(
        200, AggregateShare(SHARE).encode(), {"Content-Type": media_type("aggregate-share")}
    )
    helper.answers = [Answer(200, headers={"Location": f"{resource}/1", "Retry-After": "0"})]
    helper.answers.append(share)
    helper.seen.clear()
    assert _ask(task) == SHARE
    (_, _, posted, _), (method, path, polled, _) = helper.seen
    assert (method, path) == ("GET", f"{resource}/1")
    assert polled["authorization"] == posted["authorization"] == f"Bearer {task.aggregator_token}"
    # And the other server, named as a task's helper, is reached.
    elsewhere.answers = [share]
    assert _ask(_task(elsewhere)) == SHARE
    assert [m for m, _, _, _ in elsewhere.seen] == ["POST"]

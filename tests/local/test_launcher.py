"""veil.local.launcher: the ports it hands out and how it decides a server
is up (the servers themselves: tests/integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from veil.local import launcher
from veil.local.launcher import LocalDeployment, ServerProcess, free_port
from veil.task import DpSpec, VdafSpec


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_free_ports_lie_below_the_range_outgoing_connections_use() -> None:
    # Where the kernel says which ports client sockets are given, a port
    # handed out for a server is not one of them (a connect elsewhere could
    # take it before the server binds).
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not path.exists():
        pytest.skip("this kernel does not say which ports outgoing connections use")
    start = int(path.read_text().split()[0])
    if start < 11000:
        pytest.skip(f"outgoing connections use ports from {start}: no room below")
    ports = [free_port() for _ in range(200)]
    assert all(10000 <= port < start for port in ports)


def test_processes_sharing_the_range_draw_from_parts_of_their_own() -> None:
    # The suite's parallel workers each take a part (tests/conftest.py): no
    # two of them can draw one free port and both try to bind it.
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not path.exists() or int(path.read_text().split()[0]) < 10000 + 4 * 1000:
        pytest.skip("no room below the ports outgoing connections use for four parts")
    width = (int(path.read_text().split()[0]) - 10000) // 4
    before = launcher._part
    try:
        for index in range(4):
            launcher.share_ports(index, 4)
            ports = [free_port() for _ in range(50)]
            low = 10000 + index * width
            assert all(low <= port < low + width for port in ports), (index, ports)
        with pytest.raises(ValueError, match="index"):
            launcher.share_ports(4, 4)
    finally:
        launcher._part = before


def test_a_server_of_the_other_role_on_the_address_is_not_taken_for_it(
    tmp_path: Path,
) -> None:
    # A leader configured on the helper's address cannot bind it. The
    # helper answers health checks there, but not for the leader's service,
    # so start() reports the leader's exit instead of returning as if it
    # were serving (a deployment whose leader and helper were given one port
    # once passed for healthy, and every leader call then failed with
    # UNIMPLEMENTED).
    tasks = {"count": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1})}
    with LocalDeployment.start(tmp_path, tasks) as dep:
        text = (tmp_path / "leader.toml").read_text()
        text = text.replace(dep.leader.address, dep.helper.address)
        text = text.replace("leader.db", "second.db")
        config = tmp_path / "second.toml"
        config.write_text(text)
        config.chmod(0o600)
        second = ServerProcess("leader", config, tmp_path / "second.log", dep.helper.address)
        try:
            with pytest.raises(RuntimeError, match="leader exited"):
                second.start(timeout=20)
        finally:
            second.stop()

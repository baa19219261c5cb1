"""`veil task new --protocol dap --leader-config/--helper-config` gives each
veil server's config its `[dap] listen` where `veil survey deploy` would
(veil.deploy.dap_listen_address): the written configs start real servers
answering DAP's HPKE config route on loopback; a config already serving DAP
on the endpoint's port is kept, one serving it on another port refused;
hostile values (a port in use, an endpoint without a valid port or host, of
the wrong scheme, on the gRPC port, a config for the role another
implementation runs) are refused with one line and nothing written."""

from __future__ import annotations

import socket
import tomllib
import urllib.request
from pathlib import Path

import pytest

from veil.aggregator.run.config import load_config
from veil.cli import main as veil_main
from veil.dap.messages import HpkeConfigList
from veil.local.launcher import ServerProcess, free_port
from veil.task import LeaderTask, load_task


def task_new(
    root: Path, name: str, grpc: tuple[str, str], dap: tuple[str, str], *extra: str
) -> int:
    return veil_main(
        [
            "task", "new", "--vdaf", "count", "--leader", grpc[0], "--helper", grpc[1],
            "--name", name, "--out", str(root), "--protocol", "dap", "--dap-leader", dap[0],
            "--dap-helper", dap[1], "--leader-config", str(root / "leader.toml"),
            "--helper-config", str(root / "helper.toml"), *extra,
        ]
    )  # fmt: skip


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _loopback() -> tuple[tuple[str, str], tuple[str, str]]:
    """(gRPC addresses, DAP endpoints) of a leader and a helper on free loopback ports."""
    ports = [free_port() for _ in range(4)]
    grpc = (f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}")
    return grpc, (f"http://127.0.0.1:{ports[2]}/", f"http://127.0.0.1:{ports[3]}/")


def test_the_written_configs_serve_dap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grpc, dap = _loopback()
    capsys.readouterr()
    assert task_new(tmp_path, "first", grpc, dap) == 0
    said = capsys.readouterr().out
    for role, endpoint in zip(("leader", "helper"), dap, strict=True):
        listen = endpoint.removeprefix("http://").rstrip("/")
        config = tomllib.loads((tmp_path / f"{role}.toml").read_text())
        assert config["dap"] == {"listen": listen}
        assert load_config(tmp_path / f"{role}.toml").dap_listen == listen
        assert f"the {role} serves it on {listen} ([dap] listen added to" in said
    # A second task on the same endpoints joins the same listeners.
    assert task_new(tmp_path, "second", grpc, dap) == 0
    assert "[dap] listen added" not in capsys.readouterr().out
    for role in ("leader", "helper"):
        config = tomllib.loads((tmp_path / f"{role}.toml").read_text())
        assert config["tasks"] == [f"first.{role}.toml", f"second.{role}.toml"]

    servers = []
    try:
        for role, address in (("helper", grpc[1]), ("leader", grpc[0])):
            server = ServerProcess(
                role, tmp_path / f"{role}.toml", tmp_path / f"{role}.log", address
            )
            server.start()
            servers.append(server)
        for endpoint in dap:
            with urllib.request.urlopen(f"{endpoint}hpke_config", timeout=30) as response:
                assert response.status == 200
                assert response.headers["content-type"] == (
                    "application/ppm-dap;message=hpke-config-list"
                )
                assert HpkeConfigList.decode(response.read()).first_supported() is not None
    finally:
        for server in reversed(servers):
            server.stop()

    # A task on another port of a config already serving DAP is refused:
    # [dap] listen is never overwritten, and nothing is written.
    before = _files(tmp_path)
    moved = (f"http://127.0.0.1:{free_port()}/", dap[1])
    assert task_new(tmp_path, "third", grpc, moved) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil task new: ") and err.count("\n") == 1
    assert "leader.toml already serves DAP on" in err and "never overwritten" in err
    assert _files(tmp_path) == before


def test_with_tls_the_listener_serves_the_configs_certificate(tmp_path: Path) -> None:
    """As deploy does with TLS: an https endpoint, on every interface unless
    the endpoint is a loopback one; a config without [tls] takes http only."""
    for role in ("leader", "helper"):
        (tmp_path / f"{role}.toml").write_text(
            f'listen = "0.0.0.0:{7001 if role == "leader" else 7002}"\nstorage = "{role}.db"\n'
            f'tasks = []\n[tls]\ncert = "{role}.pem"\nkey = "{role}.key"\n'
        )
    grpc = ("leader.example:7001", "helper.example:7002")
    dap = ("https://leader.example:8443/", f"https://127.0.0.1:{free_port()}/")
    assert task_new(tmp_path, "t", grpc, dap) == 0
    assert load_config(tmp_path / "leader.toml").dap_listen == "0.0.0.0:8443"
    helper = load_config(tmp_path / "helper.toml")
    assert helper.dap_listen == f"127.0.0.1:{dap[1].rsplit(':', 1)[1].rstrip('/')}"
    assert helper.tls is not None
    assert isinstance(load_task(tmp_path / "t.leader.toml", LeaderTask), LeaderTask)


def _write_grpc_config(root: Path, role: str, dap_listen: str | None = None) -> None:
    text = f'listen = "127.0.0.1:{free_port()}"\nstorage = "{role}.db"\ntasks = []\n'
    if dap_listen is not None:
        text += f'[dap]\nlisten = "{dap_listen}"\n'
    (root / f"{role}.toml").write_text(text)


@pytest.mark.parametrize(
    "case",
    ["port-in-use", "no-valid-port", "no-host", "https-without-tls", "on-grpc-port",
     "same-port", "other-implementation", "listen-not-host-port"],
)  # fmt: skip
def test_hostile_values_are_refused_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    grpc, dap = _loopback()
    extra: tuple[str, ...] = ()
    held = None
    if case == "port-in-use":
        held = socket.create_server(("127.0.0.1", 0))
        dap = (f"http://127.0.0.1:{held.getsockname()[1]}/", dap[1])
        says = f"port {held.getsockname()[1]} is in use on this machine"
    elif case == "no-valid-port":
        dap = ("http://127.0.0.1:99999/", dap[1])
        says = "the leader's DAP endpoint 'http://127.0.0.1:99999/' has no valid port"
    elif case == "no-host":
        dap = (dap[0], "http://:8002/")
        says = "the helper's DAP endpoint 'http://:8002/' names no host"
    elif case == "https-without-tls":
        dap = (dap[0].replace("http:", "https:"), dap[1])
        says = "must be an http URL (leader.toml has no [tls] table: it serves plain HTTP)"
    elif case == "on-grpc-port":
        dap = (dap[0], f"http://{grpc[1]}/")
        says = f"is on its gRPC port {grpc[1].rsplit(':', 1)[1]}: give each its own"
    elif case == "same-port":
        dap = (dap[0], dap[0])
        says = "the leader and the helper would both serve DAP on 127.0.0.1:"
    elif case == "other-implementation":
        extra = ("--dap-other-implementation", "helper")
        says = "--helper-config: the helper runs another DAP implementation"
    else:
        # An existing config whose [dap] listen is not host:port is not
        # taken for one serving the endpoint's port.
        _write_grpc_config(tmp_path, "helper", "nonsense")
        says = "helper.toml already serves DAP on 'nonsense'"
    before = _files(tmp_path)
    capsys.readouterr()
    try:
        assert task_new(tmp_path, "t", grpc, dap, *extra) == 2
    finally:
        if held is not None:
            held.close()
    err = capsys.readouterr().err
    assert err.startswith("veil task new: ") and err.count("\n") == 1
    assert says in err, err
    assert _files(tmp_path) == before

"""`veil survey deploy`: every file a two-organisation deployment of a
survey needs, each party's in its own directory.

::

    OUT/leader/      leader.toml, tasks/<question>.toml   (organisation A)
    OUT/helper/      helper.toml, tasks/<question>.toml   (organisation B)
    OUT/collector/   <question>.toml, survey.toml          (the survey operator)
    OUT/client/      <question>.toml                       (public: ship with the client)

The leader's, helper's and collector's directories and files are created
readable by their owner only (they hold the verify key, tokens and the
collector's HPKE private key); the client files are public. With TLS the
server configs name certificate files under each server's ``tls/`` directory;
each organisation puts its own certificates there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from veil.demo import task_specs
from veil.survey import Survey
from veil.task import new_task

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PUBLIC_DIR = 0o755
PUBLIC_FILE = 0o644


class DeployError(ValueError):
    """The output directory or an option cannot be used."""


@dataclass(frozen=True)
class Deployment:
    out: Path
    leader_config: Path
    helper_config: Path
    collector_dir: Path
    client_dir: Path


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` from the first byte on (no window in which
    a secret is readable by others); refuses to overwrite."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # the umask may have narrowed a public file


def _toml(path: Path, data: dict[str, Any], mode: int) -> None:
    write_file(path, tomli_w.dumps(data).encode(), mode)


def deploy_survey(
    survey: Survey,
    survey_text: str,
    out: Path,
    leader: str,
    helper: str,
    *,
    tls: bool = True,
    time_precision: int = 3600,
) -> Deployment:
    """Write the deployment of ``survey`` under ``out`` (which must not exist)."""
    for address in (leader, helper):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise DeployError(f"{address!r} is not host:port")
    if out.exists():
        raise DeployError(f"{out} already exists; choose a new directory (nothing is overwritten)")
    dirs = {name: out / name for name in ("leader", "helper", "collector", "client")}
    out.mkdir(parents=True)
    for name, d in dirs.items():
        d.mkdir(mode=PUBLIC_DIR if name == "client" else PRIVATE_DIR)
    for role in ("leader", "helper"):
        (dirs[role] / "tasks").mkdir(mode=PRIVATE_DIR)

    task_names = []
    for qid, (vdaf, dp, kwargs) in task_specs(survey).items():
        files = new_task(vdaf, leader, helper, dp=dp, time_precision=time_precision, **kwargs)
        task_names.append(qid)
        _toml(dirs["leader"] / "tasks" / f"{qid}.toml", files.leader.to_dict(), PRIVATE_FILE)
        _toml(dirs["helper"] / "tasks" / f"{qid}.toml", files.helper.to_dict(), PRIVATE_FILE)
        _toml(dirs["collector"] / f"{qid}.toml", files.collector.to_dict(), PRIVATE_FILE)
        _toml(dirs["client"] / f"{qid}.toml", files.client.to_dict(), PUBLIC_FILE)
    write_file(dirs["collector"] / "survey.toml", survey_text.encode(), PRIVATE_FILE)

    for role, listen in (("leader", leader), ("helper", helper)):
        port = listen.rpartition(":")[2]
        config: dict[str, Any] = {
            "listen": f"0.0.0.0:{port}" if tls else f"127.0.0.1:{port}",
            "storage": f"{role}.db",
            "tasks": [f"tasks/{name}.toml" for name in task_names],
            "log_format": "json",
        }
        if tls:
            # Server-authenticated TLS on both servers. The leader proves itself
            # to the helper with its bearer token, as in DAP; requiring client
            # certificates on the helper would also lock out the clients, which
            # fetch the helper's HPKE configuration themselves.
            config["tls"] = {"cert": f"tls/{role}.crt", "key": f"tls/{role}.key"}
            if role == "leader":
                config["helper_tls"] = {"ca": "tls/helper-ca.crt"}
            (dirs[role] / "tls").mkdir(mode=PRIVATE_DIR)
        _toml(dirs[role] / f"{role}.toml", config, PRIVATE_FILE)

    return Deployment(
        out,
        dirs["leader"] / "leader.toml",
        dirs["helper"] / "helper.toml",
        dirs["collector"],
        dirs["client"],
    )

"""docs/POSTGRESQL.md run as written against a throwaway cluster: the role
and database, the password file and the DSN, the leader's start (schema
created), its status, a backup and its restore into a scratch database.
Only `db.internal:5432` is replaced by the cluster's address, and the
leader the doc starts in the foreground is started and stopped by the test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.docs import blocks as doc_blocks
from veil.deploy import deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.survey import parse_survey
from veil.times import format_time

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SURVEY = """\
[survey]
name = "Walk-through"
epsilon = 1
time_precision = 3600
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "remote"
kind = "yes_no"
"""


def blocks() -> list[str]:
    return [b.code for b in doc_blocks("docs/POSTGRESQL.md", "sh")]


def _drop(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in (
            "DROP DATABASE IF EXISTS veil_leader_check",
            "DROP DATABASE IF EXISTS veil_leader",
            "DROP ROLE IF EXISTS veil_leader",
        ):
            conn.execute(statement)  # type: ignore[arg-type]


def test_postgresql_walkthrough_runs_as_written(tmp_path: Path, postgres_server: str) -> None:
    create, dsn_block, start, check, dump, restore = blocks()
    params = conninfo_to_dict(postgres_server)
    address = f"{params.get('host', '127.0.0.1')}:{params.get('port', '5432')}"
    _drop(postgres_server)
    home = tmp_path / "home"
    home.mkdir()
    env = dict(
        os.environ,
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        # The administrator's connection (the doc's `sudo -u postgres -i`).
        PGHOST=str(params.get("host", "127.0.0.1")),
        PGPORT=str(params.get("port", "5432")),
        PGUSER=str(params.get("user", "postgres")),
        PGDATABASE=str(params.get("dbname", "postgres")),
    )
    if "password" in params:
        env["PGPASSWORD"] = str(params["password"])

    def run(block: str) -> str:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.replace("db.internal:5432", address)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    now = int(time.time())
    opens = now - now % 3600
    text = SURVEY.format(opens=format_time(opens), closes=format_time(opens + 7200))
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = deploy_survey(
        parse_survey(text), text, tmp_path / "deployment", leader, helper, tls=False
    )
    try:
        run(create)
        run(dsn_block)
        pgpass = home / ".pgpass"
        assert pgpass.stat().st_mode & 0o077 == 0
        config = dep.leader_config.read_text()
        assert f'storage = "postgresql://veil_leader@{address}/veil_leader"' in config

        assert start.strip() == "veil leader --config deployment/leader/leader.toml"
        server = ServerProcess(
            "leader", dep.leader_config, tmp_path / "leader.log", leader, env={"HOME": str(home)}
        )
        server.start()
        try:
            shown = run(check)
            assert "remote" in shown or "task" in shown, shown
            assert "reports" in shown and "veil_schema" in shown, shown
            # The leader created its schema as the role that owns the database.
            url = f"postgresql://veil_leader@{address}/veil_leader"
            with psycopg.connect(url, passfile=str(pgpass)) as conn:
                row = conn.execute("SELECT count(*) FROM hpke_keys").fetchone()
                assert row is not None and row[0] >= 1
        finally:
            server.stop()

        run(dump)
        (backup,) = tmp_path.glob("leader-*.dump")
        assert backup.stat().st_size > 0
        restored = run(restore)
        assert re.search(r"max\s*-+\s*\d+", restored), restored
        assert re.search(r"count\s*-+\s*0", restored), restored
    finally:
        _drop(postgres_server)

"""A throwaway PostgreSQL server, for the benchmarks and the test suite (which
imports it from here: a benchmark imports nothing from tests/).

Uses ``VEIL_TEST_POSTGRES_DSN`` when set. Otherwise it runs ``initdb`` and
``pg_ctl`` from the system's PostgreSQL in a temporary directory, listening
only on 127.0.0.1 at a free port, as an unprivileged user (PostgreSQL
refuses to run as root: when the tests run as root, the server runs as the
``postgres`` system user), and removes everything on exit.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from veil.local.launcher import free_port

DSN_ENV = "VEIL_TEST_POSTGRES_DSN"


def find_pg_bin() -> Path | None:
    """The directory holding initdb and pg_ctl, if PostgreSQL is installed."""
    for name in ("initdb", "pg_ctl"):
        found = shutil.which(name)
        if found and Path(found).resolve().parent.joinpath("pg_ctl").exists():
            return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for c in candidates:
        if Path(c, "initdb").exists() and Path(c, "pg_ctl").exists():
            return Path(c)
    return None


def with_schema(dsn: str, schema: str) -> str:
    """`dsn` with every table in `schema` (created if missing): one database, many stores."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    return make_conninfo(dsn, options=f"-c search_path={schema}")


def as_url(dsn: str) -> str:
    """`dsn` (key=value or URL) as a postgresql:// URL, the form veil's configs take."""
    params = conninfo_to_dict(dsn)
    host = str(params.pop("host", "127.0.0.1"))
    port = str(params.pop("port", "5432"))
    user = quote(str(params.pop("user", "postgres")), safe="")
    password = params.pop("password", None)
    dbname = quote(str(params.pop("dbname", "postgres")), safe="")
    auth = user if password is None else f"{user}:{quote(str(password), safe='')}"
    query = urlencode({k: str(v) for k, v in params.items() if v is not None}, quote_via=quote)
    return f"postgresql://{auth}@{host}:{port}/{dbname}" + (f"?{query}" if query else "")


@contextmanager
def postgres_dsn(durable: bool = False) -> Iterator[str]:
    """Yield a DSN for an empty database; the server lives for the block.
    `durable`: commits wait for the disk (fsync on), as in production; the
    default skips fsync, which tests do not need."""
    configured = os.environ.get(DSN_ENV)
    if configured:
        yield configured
        return
    bindir = find_pg_bin()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL is not installed (no initdb/pg_ctl); install the system package "
            f"'postgresql' or set {DSN_ENV}"
        )
    root = Path(tempfile.mkdtemp(prefix="veil-pg-"))
    data, sockets, logfile = root / "data", root / "sock", root / "server.log"
    sockets.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        for path in (root, sockets):
            os.chown(path, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    try:
        subprocess.run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "veil",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(logfile),
                "-w",
                "-o",
                f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets}"
                f" -c fsync={'on' if durable else 'off'} -c max_connections=200",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        yield f"host=127.0.0.1 port={port} user=veil dbname=postgres"
    finally:
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)

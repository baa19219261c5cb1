"""Choosing the storage backend in a server config, and showing it without secrets."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from veil.aggregator.run.config import ConfigError, load_config
from veil.aggregator.store.postgres import storage_label


def _config(tmp_path: Path, storage: str) -> Path:
    path = tmp_path / "leader.toml"
    path.write_text(f'listen = "127.0.0.1:1"\n{storage}\n')
    return path


def test_sqlite_path_postgres_url_or_table(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path, 'storage = "l.db"')).storage == tmp_path / "l.db"
    url = "postgresql://veil@db.internal:5432/leader"
    config = load_config(_config(tmp_path, f'storage = "{url}"'))
    assert (config.storage, config.pool_size) == (url, 8)
    config = load_config(_config(tmp_path, f'[storage]\nurl = "{url}"\npool_size = 3'))
    assert (config.storage, config.pool_size) == (url, 3)
    config = load_config(_config(tmp_path, '[storage]\npath = "x.db"'))
    assert config.storage == tmp_path / "x.db"


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ('storage = "mysql://db/x"', "only postgresql://"),
        ('storage = ""', "file name or a postgresql:// URL"),
        ('[storage]\nurl = "postgresql://a/b"\npath = "x.db"', "either 'url'"),
        ('[storage]\nurl = "postgresql://a/b"\npool_size = 0', "at least 1"),
        ('[storage]\nuri = "postgresql://a/b"', "unknown setting 'uri' in \\[storage\\]"),
    ],
)
def test_bad_storage_is_refused(tmp_path: Path, storage: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_config(tmp_path, storage))


def test_driver_settings(tmp_path: Path) -> None:
    path = _config(tmp_path, 'storage = "l.db"\n[driver]\nenabled = false\nlease_seconds = 5')
    config = load_config(path)
    assert (config.driver_enabled, config.lease_seconds) == (False, 5.0)
    with pytest.raises(ConfigError, match="lease_second"):
        load_config(_config(tmp_path, 'storage = "l.db"\n[driver]\nlease_second = 5'))


def test_label_never_shows_the_password() -> None:
    label = storage_label("postgresql://veil:s3cret@db.internal:5432/leader?sslmode=require")
    assert "s3cret" not in label
    assert label == "postgresql://veil@db.internal/leader"
    assert storage_label(Path("/var/lib/veil/leader.db")) == "/var/lib/veil/leader.db"


def _server_config(tmp_path: Path, role: str, storage: str) -> Path:
    """A `role` config with one task and `storage`, as `veil task new` writes it."""
    from veil.cli import main as veil_main

    config = tmp_path / f"{role}.toml"
    assert (
        veil_main(
            [
                "task",
                "new",
                "--vdaf",
                "count",
                "--leader",
                "127.0.0.1:1",
                "--helper",
                "127.0.0.1:2",
                "--out",
                str(tmp_path),
                f"--{role}-config",
                str(config),
            ]
        )
        == 0
    )
    settings = tomllib.loads(config.read_text())
    config.write_text(tomli_w.dumps({**settings, "storage": storage}))
    return config


def _start(config: Path, role: str, *wrapper: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "veil.cli", role, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line_refusal(run: subprocess.CompletedProcess[str], role: str, why: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith(f"veil {role}: cannot open the database "), run.stderr
    assert why in run.stderr, run.stderr


@pytest.mark.parametrize("role", ["leader", "helper"])
def test_unwritable_storage_is_one_line_not_a_traceback(tmp_path: Path, role: str) -> None:
    # Both fail for root as well: no directory, and a "directory" that is a file.
    config = _server_config(tmp_path / "a", role, "missing/db.sqlite")
    _one_line_refusal(_start(config, role), role, "missing does not exist")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "plain").write_text("a file, not a directory")
    config = _server_config(tmp_path / "b", role, "plain/db.sqlite")
    _one_line_refusal(_start(config, role), role, "Not a directory")
    assert not list(tmp_path.glob("**/db.sqlite*"))


def test_read_only_file_system_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    # A real EROFS: an empty tmpfs mounted read-only in a mount namespace of
    # the server's own (a directory's mode bits would not stop root).
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare, "-rm", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs unshare -rm (user and mount namespaces) for a read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    config = _server_config(tmp_path, "leader", "ro/leader.db")
    mount = 'mount -t tmpfs -o ro,size=64k tmpfs "$0" && exec "$@"'
    run = _start(config, "leader", "unshare", "-rm", "sh", "-c", mount, str(ro))
    _one_line_refusal(run, "leader", "the file system is read-only")

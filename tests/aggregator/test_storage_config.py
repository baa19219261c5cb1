"""Choosing the storage backend in a server config, and showing it without secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from veil.aggregator.postgres import storage_label
from veil.aggregator.server import ConfigError, load_config


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

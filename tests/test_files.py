"""veil.files: files created or replaced without following a link at their name."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from veil.files import create_file, replace_file


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_create_refuses_any_existing_name(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("victim", "link", "dangling"):
        with pytest.raises(FileExistsError):
            create_file(tmp_path / name, b"key", 0o600)
    assert target.read_bytes() == b"precious"
    assert not (tmp_path / "nowhere").exists()


def test_create_sets_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        create_file(tmp_path / "public", b"x", 0o644)
    finally:
        os.umask(old)
    old = os.umask(0)
    try:
        create_file(tmp_path / "secret", b"x", 0o600)
    finally:
        os.umask(old)
    assert (mode(tmp_path / "public"), mode(tmp_path / "secret")) == (0o644, 0o600)


def test_replace_replaces_a_link_never_its_target(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    target.chmod(0o644)
    link = tmp_path / "task.collector.toml"
    link.symlink_to(target)
    replace_file(link, b"private key", 0o600)
    assert target.read_bytes() == b"precious" and mode(target) == 0o644
    assert not link.is_symlink() and link.read_bytes() == b"private key"
    assert mode(link) == 0o600
    # No temporary file is left beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task.collector.toml", "victim"]


def test_replace_keeps_a_narrowed_mode_unless_told(tmp_path: Path) -> None:
    path = tmp_path / "leader.toml"
    replace_file(path, b"a", None)
    assert mode(path) == 0o644
    path.chmod(0o600)
    replace_file(path, b"b", None)
    assert (path.read_bytes(), mode(path)) == (b"b", 0o600)

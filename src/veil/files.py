"""Writing the files veil hands to people: task files with keys, configs,
deployments. None follows a link planted at the name it writes, and a secret
is never readable by others, not even for a moment.

`create_file` makes a new file and refuses an existing name (a file, or a
link, dangling or not: O_EXCL does not follow it); `replace_file` writes a
new file beside the name and renames it over the name, so a link there is
replaced, never written through, and readers see the old or the new file,
never half of one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_file(path: Path, data: bytes, mode: int) -> None:
    """Create `path` holding `data`, with `mode` from its creation on (the umask
    may not widen or narrow it); FileExistsError if anything has that name."""
    fd = os.open(path, _NEW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def replace_file(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` at `path`, replacing what is there without following a link.

    `mode` None keeps the mode of the regular file being replaced (0o644 for
    a new one): an operator who narrowed a config keeps it narrow.
    """
    if mode is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            mode = 0o644
        else:
            mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o644
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    create_file(tmp, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

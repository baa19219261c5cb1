"""A task's files: reading one strictly as the role it must be, writing
them safely, and a new task's ids, keys and tokens split into each party's
view (`veil task new`, `veil survey deploy`).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from veil.files import create_file, replace_file
from veil.hpke import generate_keypair
from veil.settings import SettingsError, read_toml
from veil.task.common import (
    DEFAULT_MAX_CLOCK_SKEW,
    DEFAULT_NOT_AFTER,
    DEFAULT_NOT_BEFORE,
    DEFAULT_TIME_PRECISION,
    TASK_ID_SIZE,
    TaskError,
    hash_token,
)
from veil.task.roles import (
    ALL_TASK_KEYS,
    ROLE_TYPES,
    ClientTask,
    CollectorTask,
    HelperTask,
    LeaderTask,
    Task,
)
from veil.task.spec import DapSpec, DpSpec, VdafSpec

T = TypeVar("T", bound=Task)


def load_task(path: str | os.PathLike[str], kind: type[T] = Task) -> T:  # type: ignore[assignment]
    """Read a task file strictly: unknown, missing or mistyped settings are
    refused with their file and line, and so is a file of another role than
    `kind` (e.g. the helper's file given to the leader); raises TaskError only."""
    try:
        task = Task.from_table(read_toml(Path(path), ALL_TASK_KEYS))
    except SettingsError as e:
        raise TaskError(str(e)) from None
    return expect_role(task, kind, str(path))


def expect_role(task: Task, kind: type[T], where: str = "task") -> T:
    """`task` as `kind`, or TaskError saying whose task it is instead."""
    if not isinstance(task, kind):
        wanted = kind.role if kind in ROLE_TYPES.values() else "an aggregator"
        raise TaskError(
            f'{where}: this is the {task.role}\'s task file (role = "{task.role}");'
            f" {wanted if wanted == 'an aggregator' else 'the ' + wanted} needs its own"
        )
    return task


def write_toml(
    path: str | os.PathLike[str], data: dict[str, Any], secret: bool, *, replace: bool = True
) -> None:
    """Write `data` as TOML, never through a link at `path` (veil.files).

    A `secret` file is owner-only (0600) from its creation, a public one
    0644. With `replace` False an existing file (or link) at `path` is left
    alone and FileExistsError raised: a task's files hold its keys.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = tomli_w.dumps(data).encode()
    if replace:
        # A public file being replaced keeps its mode (an operator may have narrowed it).
        replace_file(path, text, 0o600 if secret else None)
    else:
        create_file(path, text, 0o600 if secret else 0o644)


@dataclass(frozen=True)
class TaskFiles:
    leader: LeaderTask
    helper: HelperTask
    collector: CollectorTask
    client: ClientTask


def new_task(
    vdaf: VdafSpec,
    leader_address: str,
    helper_address: str,
    *,
    min_batch_size: int,
    dp: DpSpec,
    time_precision: int = DEFAULT_TIME_PRECISION,
    not_before: int = DEFAULT_NOT_BEFORE,
    not_after: int = DEFAULT_NOT_AFTER,
    max_clock_skew: int = DEFAULT_MAX_CLOCK_SKEW,
    verify_key_size: int = 32,
    report_expiry_age: int | None = None,
    leader_ca_sha256: str | None = None,
    helper_ca_sha256: str | None = None,
    issuer_public_key: bytes | None = None,
    dap: DapSpec | None = None,
) -> TaskFiles:
    """Fresh ids, keys and tokens, split into each party's view of the task
    (`dap`: served over DAP, docs/DAP.md)."""
    if (
        dap is not None
        and dap.task_interval is None
        and (not_before != DEFAULT_NOT_BEFORE or not_after != DEFAULT_NOT_AFTER)
    ):
        # DAP binds the window as created: kept, whatever later moves the window.
        dap = replace(dap, task_interval=(not_before, not_after))
    collector_kp = generate_keypair(secrets.randbelow(256))
    aggregator_token = secrets.token_urlsafe(32)
    collector_token = secrets.token_urlsafe(32)
    client = ClientTask(
        task_id=secrets.token_bytes(TASK_ID_SIZE),
        vdaf=vdaf,
        leader_address=leader_address,
        helper_address=helper_address,
        time_precision=time_precision,
        min_batch_size=min_batch_size,
        not_before=not_before,
        not_after=not_after,
        max_clock_skew=max_clock_skew,
        dp=dp,
        collector_hpke_config=collector_kp.config,
        report_expiry_age=report_expiry_age,
        leader_ca_sha256=leader_ca_sha256,
        helper_ca_sha256=helper_ca_sha256,
        issuer_public_key=issuer_public_key,
        dap=dap,
    )
    public = client._public_fields()
    verify_key = secrets.token_bytes(verify_key_size)
    return TaskFiles(
        leader=LeaderTask(
            **public,
            verify_key=verify_key,
            aggregator_token=aggregator_token,
            collector_token_hash=hash_token(collector_token),
        ),
        helper=HelperTask(
            **public, verify_key=verify_key, aggregator_token_hash=hash_token(aggregator_token)
        ),
        collector=CollectorTask(
            **public, collector_token=collector_token, collector_hpke_keypair=collector_kp
        ),
        client=client,
    )

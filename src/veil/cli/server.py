"""For the operators of the leader and the helper: the servers, `status`, `gc`, `keys`."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.cli.common import tune_for_throughput

if TYPE_CHECKING:  # imported where used, so `veil upload` does not load the servers
    from veil.aggregator.run.backend import StorageBackend
    from veil.aggregator.run.config import ServerConfig


def cmd_server(args: argparse.Namespace) -> int:
    from veil.aggregator.run.config import ConfigError, load_config
    from veil.aggregator.run.server import AggregatorServer
    from veil.logs import configure_logging

    tune_for_throughput()
    try:
        config = load_config(Path(args.config))
        configure_logging(args.log_level or config.log_level, config.log_format == "json")
        server = AggregatorServer(args.role, config, _serve_http)
    except (ConfigError, ValueError) as e:
        print(f"veil {args.role}: {e}", file=sys.stderr)
        return 2
    server.serve_forever(Path(args.config))
    return 0


def _serve_http(
    app: Any, listener: socket.socket, tls: ssl.SSLContext | None, max_body: int
) -> None:
    """The DAP routes (the leader's or the helper's) behind the survey
    page's connection guard (caps per address and in all, header and
    request deadlines)."""
    from veil.web.app import ServeLimits
    from veil.web.guard import serve

    serve(app, listener, ServeLimits(max_body=max_body), tls=tls)


def cmd_worker(args: argparse.Namespace) -> int:
    from veil.aggregator.run.config import ConfigError, load_config
    from veil.aggregator.run.worker import AggregationWorker
    from veil.logs import configure_logging

    try:
        config = load_config(Path(args.config))
        configure_logging(args.log_level or config.log_level, config.log_format == "json")
        worker = AggregationWorker(config, args.metrics)
    except (ConfigError, ValueError) as e:
        print(f"veil worker: {e}", file=sys.stderr)
        return 2
    worker.serve_forever(Path(args.config))
    return 0


def _open_database(
    args: argparse.Namespace, command: str
) -> tuple[ServerConfig, StorageBackend] | None:
    """(config, storage) of the aggregator whose config file is --config; None
    after saying why (`veil <command>: ...`) when it cannot be opened."""
    from veil.aggregator.run.backend import open_backend
    from veil.aggregator.run.config import ConfigError, load_config

    try:
        config = load_config(Path(args.config))
        return config, open_backend(config, create=False, pool_size=1)
    except ConfigError as e:
        print(f"veil {command}: {e}", file=sys.stderr)
        return None


def _role(args: argparse.Namespace, config: ServerConfig) -> str | None:
    if args.role:
        return str(args.role)
    # Each task file declares whose it is; a server's files are all its own
    # (the server refuses to start otherwise).
    roles = sorted({t.role for t in config.tasks})
    if len(roles) > 1:
        print(
            f"veil status: {args.config} lists tasks of both roles ({', '.join(roles)}):"
            " each server lists its own task files only",
            file=sys.stderr,
        )
        return None
    return roles[0] if roles else "aggregator"


def cmd_status(args: argparse.Namespace) -> int:
    from veil.aggregator.status import gather, render_text

    opened = _open_database(args, "status")
    if opened is None:
        return 2
    config, storage = opened
    role = _role(args, config)
    if role is None:
        storage.close()
        return 2
    try:
        status = gather(role, config, storage.store, storage.budget_ledger())
    finally:
        storage.close()
    print(json.dumps(status, indent=2) if args.json else render_text(status))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    import dataclasses

    from veil.aggregator.maintenance import collect_garbage
    from veil.aggregator.store.postgres import storage_label
    from veil.logs import configure_logging

    configure_logging("warning")
    opened = _open_database(args, "gc")
    if opened is None:
        return 2
    config, storage = opened
    store = storage.store
    try:
        before = store.size_bytes()
        results = collect_garbage(store, config.tasks, time.time(), full_vacuum=args.vacuum)
        after = store.size_bytes()
    finally:
        storage.close()
    out = {
        "database": storage_label(config.storage),
        "bytes_before": before,
        "bytes_after": after,
        "deleted": {task: dataclasses.asdict(r) for task, r in results.items()},
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for task, r in results.items():
            kinds = ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(r).items() if v)
            print(f"task {task}: deleted {kinds or 'nothing'}")
        print(
            f"database {storage_label(config.storage)}: {before} bytes before, {after} bytes after"
        )
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from veil.aggregator.maintenance import KeyPolicy, KeyRotationError, activate, rotate

    opened = _open_database(args, "keys")
    if opened is None:
        return 2
    config, storage = opened
    store = storage.store
    grace = config.keys.grace_seconds if args.grace is None else args.grace
    if grace < 0:
        storage.close()
        print("veil keys: --grace must not be negative", file=sys.stderr)
        return 2
    now = time.time()
    try:
        if args.keys_command == "rotate":
            key = rotate(store, now, KeyPolicy(config.keys.pending_seconds, grace), args.now)
            if args.now:
                print(f"key {key.config_id} is active; the previous key expires in {grace:g} s")
            else:
                print(
                    f"key {key.config_id} is pending; the server makes it active after"
                    f" {config.keys.pending_seconds:g} s (or: veil keys activate"
                    f" --config {args.config} {key.config_id})"
                )
        elif args.keys_command == "activate":
            activate(store, args.config_id, now, grace)
            print(f"key {args.config_id} is active; the previous key expires in {grace:g} s")
        keys = store.hpke_keys()
    except KeyRotationError as e:
        print(f"veil keys: {e}", file=sys.stderr)
        return 1
    finally:
        storage.close()
    if args.keys_command == "list":
        rows = [
            {
                "config_id": k.config_id,
                "state": k.state,
                "created": k.created,
                "expires": k.expires_at,
            }
            for k in keys
        ]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for k in keys:
                expires = f"  deleted after {time.ctime(k.expires_at)}" if k.expires_at else ""
                print(f"{k.config_id:>3}  {k.state:<8} created {time.ctime(k.created)}{expires}")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for role in ("leader", "helper"):
        p = commands.add_parser(role, help=f"run the {role} aggregator")
        p.add_argument("--config", required=True, help=f"{role}.toml")
        p.add_argument("--log-level", help="debug, info, warning or error (default: config)")
        p.set_defaults(func=cmd_server, role=role)
    p = commands.add_parser(
        "worker",
        help="run leader aggregation and collection workers only (shared PostgreSQL storage)",
    )
    p.add_argument("--config", required=True, help="the leader's leader.toml")
    p.add_argument("--log-level", help="debug, info, warning or error (default: config)")
    p.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve this worker's Prometheus metrics here"
    )
    p.set_defaults(func=cmd_worker)

    p = commands.add_parser(
        "status", help="an aggregator's tasks, batches, jobs, collections, budgets and keys"
    )
    p.add_argument("--config", required=True, help="the server's leader.toml or helper.toml")
    p.add_argument("--role", choices=["leader", "helper"], help="(default: from the config)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = commands.add_parser(
        "gc", help="delete expired and collected data now, and report the space"
    )
    p.add_argument("--config", required=True, help="the server's leader.toml or helper.toml")
    p.add_argument(
        "--vacuum", action="store_true", help="rewrite the whole file (briefly blocks writers)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    keys = commands.add_parser("keys", help="an aggregator's HPKE keys").add_subparsers(
        dest="keys_command", required=True
    )
    for name, text in (
        ("list", "list the keys and their states"),
        ("rotate", "add a new key (pending, or active at once with --now)"),
        ("activate", "make a pending key the active one"),
    ):
        p = keys.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="the server's leader.toml or helper.toml")
        p.add_argument(
            "--grace",
            type=float,
            help="seconds the previous key still opens reports (default: [keys] grace_seconds)",
        )
        if name == "rotate":
            p.add_argument("--now", action="store_true", help="activate the new key immediately")
        if name == "activate":
            p.add_argument("config_id", type=int)
        if name == "list":
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_keys)

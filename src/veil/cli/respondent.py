"""For respondents and client apps: `veil upload`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from veil.cli.common import SHARED_CA_GONE, load_task_file, read_pem, setup_logging
from veil.client.outbox import DEFAULT_MAX_REPORTS
from veil.task import Task, VdafSpec


def parse_measurement(spec: VdafSpec, text: str) -> Any:
    """A measurement from its command-line text, as its VDAF type reads it
    (veil.vdaf.registry): an integer, or comma-separated integers."""
    return spec.kind.parse(text)


def _open_client(args: argparse.Namespace, command: str, task: Any, outbox: str | None) -> Any:
    """A Client from the trust and mTLS arguments; None (after saying why) on a user mistake."""
    from veil.client import Client, OutboxError
    from veil.trust import TrustError

    try:
        return Client(
            task,
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
            outbox=outbox,
            outbox_max_reports=getattr(args, "outbox_max", None) or DEFAULT_MAX_REPORTS,
            retries=args.retries,
        )
    except (OSError, TrustError, OutboxError, ValueError) as e:
        print(f"veil {command}: {e}", file=sys.stderr)
        return None


def _say_result(result: Any) -> int:
    """Print an upload's or flush's counts; 1 if reports were refused or stay pending."""
    line = f"uploaded {result.accepted} reports ({result.duplicates} already stored)"
    extra = [
        f"{n} {what}"
        for n, what in (
            (result.pending, "pending in the outbox"),
            (result.refused, "refused by the leader (kept in the outbox)"),
            (result.expired, "expired unsent and dropped"),
        )
        if n
    ]
    print("; ".join([line, *extra]))
    if result.error is not None:
        print(f"the leader is unreachable, flush later: {result.error}", file=sys.stderr)
    return 1 if result.pending or result.refused else 0


def cmd_upload(args: argparse.Namespace) -> int:
    from veil.client import OutboxFull, UploadError

    setup_logging(args.log_level)
    if args.ca is not None:
        print(f"veil upload: {SHARED_CA_GONE}", file=sys.stderr)
        return 2
    task = load_task_file(args.task, Task, "upload")
    texts: list[str] = []
    if args.file:
        lines = Path(args.file).read_text().splitlines()
        texts += [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    texts += args.values
    if not texts:
        print("veil upload: give a value or --file", file=sys.stderr)
        return 2
    try:
        measurements = [parse_measurement(task.vdaf, t) for t in texts]
    except ValueError as e:
        print(f"veil upload: {e}", file=sys.stderr)
        return 2
    client = _open_client(args, "upload", task, args.outbox)
    if client is None:
        return 2
    with client:
        try:
            result = client.upload_batch(measurements, report_time=args.time)
        except OutboxFull as e:
            print(f"veil upload: {e}", file=sys.stderr)
            return 1
        except ValueError as e:
            print(f"veil upload: invalid measurement: {e}", file=sys.stderr)
            return 2
        except UploadError as e:
            print(f"veil upload: {e}", file=sys.stderr)
            return 1
    return _say_result(result)


def cmd_outbox_flush(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    if not Path(args.outbox).is_file():
        print(f"veil outbox flush: no outbox at {args.outbox}", file=sys.stderr)
        return 2
    client = _open_client(
        args, "outbox flush", load_task_file(args.task, Task, "outbox flush"), args.outbox
    )
    if client is None:
        return 2
    with client:
        return _say_result(client.flush())


def cmd_outbox_status(args: argparse.Namespace) -> int:
    import json

    from veil.client import Outbox, OutboxError
    from veil.task import b64e

    if not Path(args.outbox).is_file():
        print(f"veil outbox status: no outbox at {args.outbox}", file=sys.stderr)
        return 2
    try:
        with Outbox(args.outbox) as box:
            tasks = box.status()
    except OutboxError as e:
        print(f"veil outbox status: {e}", file=sys.stderr)
        return 2
    rows = [
        {
            "task": b64e(t.task_id),
            "pending": t.pending,
            "refused": t.refused,
            "oldest": t.oldest,
            "delivered": t.delivered,
            "expired": t.expired,
        }
        for t in tasks
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("the outbox is empty")
    for r in rows:
        oldest = "" if r["oldest"] is None else f", oldest report time {r['oldest']}"
        print(
            f"task {r['task']}: {r['pending']} pending, {r['refused']} refused{oldest};"
            f" {r['delivered']} delivered, {r['expired']} expired"
        )
    return 0


def _connection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retries",
        type=_count,
        default=5,
        metavar="N",
        help="resend a call that failed on the way up to N times, with backoff (default 5)",
    )
    _trust_arguments(p)


def _trust_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    p.add_argument("--helper-ca", help="PEM file of the CA of the helper (only the helper's)")
    p.add_argument("--client-cert", help="PEM client certificate, for an mTLS aggregator")
    p.add_argument("--client-key", help="PEM key of --client-cert")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("upload", help="upload measurements of one task")
    p.add_argument("--task", required=True, help="the client's task file")
    p.add_argument("values", nargs="*", help="measurements, e.g. 1, 42 or 1,0,3")
    p.add_argument("--file", help="a file with one measurement per line")
    p.add_argument("--time", type=int, help="report time (default: now)")
    _connection_arguments(p)
    # Kept only to say why it is gone (see SHARED_CA_GONE).
    p.add_argument("--ca", help=argparse.SUPPRESS)
    p.add_argument(
        "--outbox",
        metavar="PATH",
        help="keep each sealed report in this SQLite file until the leader acknowledged it"
        " (created with mode 0600); what the leader did not take waits for `veil outbox flush`",
    )
    p.add_argument(
        "--outbox-max",
        type=_positive,
        metavar="N",
        help=f"reports the outbox may hold (default {DEFAULT_MAX_REPORTS})",
    )
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_upload)

    outbox = commands.add_parser(
        "outbox", help="reports kept by `veil upload --outbox`"
    ).add_subparsers(dest="outbox_command", required=True)
    f = outbox.add_parser("flush", help="send the pending reports of a task to its leader")
    f.add_argument("--outbox", required=True, metavar="PATH", help="the outbox file")
    f.add_argument("--task", required=True, help="the client's task file")
    _connection_arguments(f)
    f.add_argument("--log-level", default="warning")
    f.set_defaults(func=cmd_outbox_flush)
    st = outbox.add_parser("status", help="what the outbox holds, per task (no network)")
    st.add_argument("--outbox", required=True, metavar="PATH", help="the outbox file")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(func=cmd_outbox_status)

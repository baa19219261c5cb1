"""For respondents and client apps: `veil upload`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from veil.cli.common import SHARED_CA_GONE, load_task_file, read_pem, setup_logging
from veil.task import VdafSpec


def parse_measurement(spec: VdafSpec, text: str) -> Any:
    """A measurement from its command-line text: an integer, or comma-separated integers."""
    text = text.strip()
    try:
        if spec.type == "count":
            if text.lower() in ("true", "yes"):
                return 1
            if text.lower() in ("false", "no"):
                return 0
            return int(text)
        if spec.type in ("sum", "histogram"):
            return int(text)
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"not a valid {spec.type} measurement: {text!r}") from None
    if spec.type == "multihot":
        return [bool(v) for v in values]
    return values


def cmd_upload(args: argparse.Namespace) -> int:
    from veil.client import Client, UploadError
    from veil.trust import TrustError

    setup_logging(args.log_level)
    if args.ca is not None:
        print(f"veil upload: {SHARED_CA_GONE}", file=sys.stderr)
        return 2
    task = load_task_file(args.task)
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
    try:
        client = Client(
            task,
            leader_root_certificates=read_pem(args.leader_ca),
            helper_root_certificates=read_pem(args.helper_ca),
            private_key=read_pem(args.client_key),
            certificate_chain=read_pem(args.client_cert),
        )
    except (OSError, TrustError) as e:
        print(f"veil upload: {e}", file=sys.stderr)
        return 2
    with client:
        try:
            result = client.upload_batch(measurements, report_time=args.time)
        except ValueError as e:
            print(f"veil upload: invalid measurement: {e}", file=sys.stderr)
            return 2
        except UploadError as e:
            print(f"veil upload: {e}", file=sys.stderr)
            return 1
    print(f"uploaded {result.accepted} reports ({result.duplicates} already stored)")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("upload", help="upload measurements of one task")
    p.add_argument("--task", required=True, help="the client's task file")
    p.add_argument("values", nargs="*", help="measurements, e.g. 1, 42 or 1,0,3")
    p.add_argument("--file", help="a file with one measurement per line")
    p.add_argument("--time", type=int, help="report time (default: now)")
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    p.add_argument("--helper-ca", help="PEM file of the CA of the helper (only the helper's)")
    # Kept only to say why it is gone (see SHARED_CA_GONE).
    p.add_argument("--ca", help=argparse.SUPPRESS)
    p.add_argument("--client-cert", help="PEM client certificate, for an mTLS aggregator")
    p.add_argument("--client-key", help="PEM key of --client-cert")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_upload)

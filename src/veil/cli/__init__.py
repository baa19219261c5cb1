"""The `veil` command: one module per group of users.

- `operator`: the survey operator (demo, simulate, survey deploy, survey collect);
- `collect`: the collector of one task (collect);
- `respondent`: respondents and client apps (survey respond, upload);
- `server`: the operators of the leader and the helper (servers, status, gc, keys);
- `setup`: task set-up by hand (task new);
- `web`: whoever hosts the survey page for browsers (survey serve);
- `window`: both organisations and the survey operator (survey close, extend).

Each module registers its own subcommands and handlers; this one only wires them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from veil.cli import collect, invite, operator, respondent, server, setup, web, window
from veil.logs import quiet_grpc_core


def _version() -> str:
    # importlib.metadata is a fifth of a bare start's imports: only --version pays it.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("veil")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


class _Version(argparse.Action):
    """argparse's "version" action, with the version looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"veil {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veil", description="veil: private aggregation with differentially private output"
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True)
    survey = commands.add_parser(
        "survey",
        help="surveys: plan, deploy, respond, serve, invite, issuer, status, close, extend,"
        " collect",
    ).add_subparsers(dest="survey_command", required=True)
    operator.register(commands, survey)
    collect.register(commands)
    respondent.register(commands, survey)
    web.register(survey)
    invite.register(survey)
    window.register(survey)
    setup.register(commands)
    server.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    quiet_grpc_core()  # before any channel or server starts gRPC's core
    args = build_parser().parse_args(argv)
    refused = getattr(args, "refused", None)
    if refused is not None:  # an option that only says what replaced it
        print(refused, file=sys.stderr)
        return 2
    result: int = args.func(args)
    return result

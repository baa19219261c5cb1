"""What the command modules share: logging, task files, output style."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from veil.survey.results import QuestionResult
    from veil.task import DapSpec, Task

# One CA file for both aggregators lets either pose as the other to clients
# (and as the leader to the collector): `--ca` refuses, saying so.
SHARED_CA_GONE = (
    "--ca is gone: give each aggregator its own CA with --leader-ca and --helper-ca"
    " (one file trusted for both lets either aggregator pose as the other)"
)


class _RetiredCa(argparse.Action):
    """`--ca` refused before any command runs: `main` prints the one line
    this leaves in `refused` and exits 2, nothing read or sent."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.refused = f"{parser.prog}: {SHARED_CA_GONE}"


def add_retired_ca(parser: argparse.ArgumentParser) -> None:
    """The old shared-trust option, kept only to say what replaced it."""
    parser.add_argument("--ca", action=_RetiredCa, help=argparse.SUPPRESS)


if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at run time
    _SubParsers = argparse._SubParsersAction


class DeferredCommands(_SubParsers):
    """Subcommands whose arguments are added only when one is chosen (to run
    it or to print its help): what they are built from (the VDAF registry,
    the task defaults) is imported then, not at every start of `veil`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments: dict[str, Callable[[argparse.ArgumentParser], None]] = {}

    def defer(
        self, name: str, arguments: Callable[[argparse.ArgumentParser], None], **kwargs: Any
    ) -> None:
        """Command `name` (`kwargs` as for add_parser), given its arguments by
        `arguments(parser)` when it is chosen."""
        self.add_parser(name, **kwargs)
        self._arguments[name] = arguments

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        add = self._arguments.pop(values[0], None)
        if add is not None:
            add(self.choices[values[0]])
        super().__call__(parser, namespace, values, option_string)


def setup_logging(level: str) -> None:
    """Log to stderr at `level`; VEIL_LOG_LEVEL, when set, wins (as for the servers)."""
    from veil.logs import LEVEL_ENV

    name = os.environ.get(LEVEL_ENV) or level
    logging.basicConfig(
        level=getattr(logging, name.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def status_printer(quiet: bool) -> Callable[[str], None]:
    """Status lines go to stderr, and not at all with --json."""

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    return say


def print_results(results: Sequence[QuestionResult], as_json: bool) -> None:
    from veil.render.text import demo_json, format_table

    print(demo_json(results) if as_json else format_table(results))


def tune_for_throughput() -> None:
    """Process-wide settings for the batched VDAF path (see veil.tuning):
    recycle freed arrays, and one BLAS thread (parallelism is per process)."""
    from veil.tuning import limit_blas_threads, tune_allocator

    tune_allocator()
    limit_blas_threads(1)


T = TypeVar("T", bound="Task")


def load_task_file(path: str, kind: type[T], command: str) -> T:
    """The task file at `path`, of the role `kind`; a mistake in it is a
    user's mistake: `veil <command>: <message>` on stderr and exit status 2."""
    from veil.task import TaskError, load_task

    try:
        return load_task(Path(path), kind)
    except (OSError, TaskError) as e:
        print(f"veil {command}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def read_pem(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def number(x: Any) -> Any:
    """A Fraction as an int when whole, else a float (for JSON output)."""
    if isinstance(x, list):
        return [number(v) for v in x]
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else float(x)
    return x


def add_dap_options(p: argparse.ArgumentParser, protocol_help: str) -> None:
    """The options of a task served over DAP (`veil task new`, `veil survey
    deploy`): --protocol and the [dap] table's values (`dap_spec` reads them)."""
    p.add_argument("--protocol", choices=("grpc", "dap"), default="grpc", help=protocol_help)
    p.add_argument("--dap-leader", help="the leader's DAP base URL (--protocol dap)")
    p.add_argument("--dap-helper", help="the helper's DAP base URL (--protocol dap)")
    p.add_argument("--dap-version", help="dap-19 (default) or dap-18 (--protocol dap)")
    p.add_argument(
        "--dap-other-implementation",
        metavar="ROLE",
        help="leader or helper: that aggregator runs another DAP implementation, which adds no"
        " noise; veil's adds all of it (--protocol dap; independent noise mode only)",
    )
    p.add_argument(
        "--batch-mode",
        metavar="MODE",
        help="time-interval (default: the collector names an interval) or leader-selected (the"
        " leader forms batches of at least min_batch_size) (--protocol dap)",
    )
    p.add_argument(
        "--task-info", help="DAP's task_info, at most 255 bytes (--protocol dap; dap-18: required)"
    )


def dap_spec(args: argparse.Namespace) -> DapSpec | None:
    """The [dap] table of a task served over DAP (--protocol dap), or None;
    TaskError for an option that does not fit."""
    from veil.dap import DEFAULT_VERSION
    from veil.task import DapSpec, TaskError

    given = [
        name
        for name, value in (
            ("--dap-leader", args.dap_leader),
            ("--dap-helper", args.dap_helper),
            ("--dap-version", args.dap_version),
            ("--task-info", args.task_info),
            ("--dap-other-implementation", args.dap_other_implementation),
            ("--batch-mode", args.batch_mode),
        )
        if value is not None
    ]
    if args.protocol != "dap":
        if given:
            raise TaskError(f"{given[0]} belongs to --protocol dap")
        return None
    if args.dap_leader is None or args.dap_helper is None:
        raise TaskError(
            "--protocol dap needs --dap-leader and --dap-helper, the aggregators' DAP base URLs"
        )
    return DapSpec(
        args.dap_leader,
        args.dap_helper,
        args.dap_version or DEFAULT_VERSION.value,
        "" if args.task_info is None else args.task_info,
        args.dap_other_implementation,
        "time-interval" if args.batch_mode is None else args.batch_mode,
    )

"""For whoever sets up tasks by hand: `veil task new`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.cli.common import DeferredCommands, add_dap_options, dap_spec

if TYPE_CHECKING:
    from veil.task import DapSpec, DpSpec


def _read_config(path: Path, role: str, listen: str) -> dict[str, Any]:
    """The server config `veil task new` adds the task to (a new one if missing),
    read as strictly as the server will read it."""
    if not path.exists():
        return {"listen": listen, "storage": f"{role}.db", "tasks": []}
    from veil.aggregator.run.config import CONFIG_KEYS
    from veil.settings import read_toml

    return dict(read_toml(path, CONFIG_KEYS).data)


def _serve_dap(role: str, path: Path, config: dict[str, Any], dap: DapSpec) -> str | None:
    """Give the server config `config` (at `path`) `[dap] listen` for the
    role's DAP endpoint, where `veil survey deploy` would put it
    (veil.deploy.dap_listen_address), serving TLS as the config does (its
    [tls] table). A config already serving DAP on that port is kept as it
    is. DeployError, nothing changed, for the role another implementation
    runs (it reads no veil config), a config serving DAP on another port
    (never overwritten), or a loopback port in use on this machine; the
    address newly given, or None."""
    from veil.deploy import DeployError, dap_listen_address
    from veil.grpc_util import is_loopback

    option = f"--{role}-config"
    if role == dap.other_implementation:
        raise DeployError(
            f"{option}: the {role} runs another DAP implementation"
            f" (--dap-other-implementation {role}), which reads no veil config"
        )
    url = dap.leader_endpoint if role == "leader" else dap.helper_endpoint
    tls = "tls" in config
    why = f"{path.name} has " + (
        "a [tls] table: its server serves TLS" if tls else "no [tls] table: it serves plain HTTP"
    )
    listen = dap_listen_address(role, url, str(config.get("listen", "")), tls, why)
    table = config.get("dap")
    current = table.get("listen") if isinstance(table, dict) else table
    port = listen.rpartition(":")[2]
    if current is not None:
        if str(current).rpartition(":")[2] == port:
            return None
        raise DeployError(
            f"{path} already serves DAP on {current!r} ([dap] listen), not on port {port} of"
            f" the {role}'s DAP endpoint {url!r}: give the endpoint that port, or change"
            " [dap] listen by hand (it is never overwritten)"
        )
    if is_loopback(listen):
        # A loopback port is this machine's: one already taken would stop
        # the server at its start (a public one may be another machine's).
        import socket

        try:
            socket.create_server(("127.0.0.1", int(port))).close()
        except OSError as e:
            raise DeployError(
                f"the {role}'s DAP endpoint {url!r}: port {port} is in use on this machine"
                f" ({e.strerror or e}), where {path} would serve DAP: choose another port"
            ) from None
    config["dap"] = {**(table or {}), "listen": listen}
    return listen


def _add_task_to_config(path: Path, config: dict[str, Any], task_file: Path) -> None:
    from veil.task import write_toml

    rel = os.path.relpath(Path(task_file).resolve(), path.parent.resolve())
    tasks = list(config.get("tasks", []))
    if str(rel) not in tasks:
        tasks.append(str(rel))
    config["tasks"] = tasks
    # Replaced by a rename, never written through a link at its name.
    write_toml(path, config, secret=False)


def _exists(path: Path) -> int:
    print(
        f"veil task new: {path} already exists (task files hold a task's keys): choose another"
        " --name or --out, or give --force to replace that task",
        file=sys.stderr,
    )
    return 2


def cmd_task_new(args: argparse.Namespace) -> int:
    from veil.dp import DPError
    from veil.settings import SettingsError
    from veil.survey.statement import task_statement
    from veil.task import TaskError, VdafSpec, new_task, write_toml

    # With a local layer a multihot report may carry any number of options (the
    # randomization turns bits on), so the proof admits every weight and
    # --max-weight bounds the respondent's own answer instead.
    local_multihot = args.local_epsilon is not None and args.vdaf == "multihot"
    try:
        vdaf = VdafSpec(
            args.vdaf,
            max_measurement=args.max_measurement,
            length=args.length,
            chunk_length=args.chunk_length,
            max_weight=args.length if local_multihot else args.max_weight,
            max_value=args.max_value,
        )
        vdaf.instantiate()
    except (ValueError, TypeError) as e:
        print(f"veil task new: bad VDAF parameters: {e}", file=sys.stderr)
        return 2
    try:
        dp = _dp_spec(args, local_max_choices=args.max_weight if local_multihot else 0)
        dp.plan(vdaf)
        dp.local(vdaf)
        # What the aggregators would refuse at start: a batch that wraps around.
        dp.bounds(vdaf).check_batch_floor(args.min_batch_size)
    except (TaskError, DPError) as e:
        print(f"veil task new: {e}", file=sys.stderr)
        return 2
    try:
        dap = dap_spec(args)
        files = new_task(
            vdaf,
            args.leader,
            args.helper,
            time_precision=args.time_precision,
            min_batch_size=args.min_batch_size,
            max_clock_skew=args.max_clock_skew,
            dp=dp,
            report_expiry_age=args.report_expiry_age,
            dap=dap,
        )
        # What another DAP implementation needs: the task id and the
        # TaskConfiguration every share's associated data binds.
        configuration = (
            None if dap is None else files.client.dap_configuration().encode(dap.dap_version).hex()
        )
    except TaskError as e:
        print(f"veil task new: {e}", file=sys.stderr)
        return 2
    configs = {}
    for role, config_path, listen in (
        ("leader", args.leader_config, args.leader),
        ("helper", args.helper_config, args.helper),
    ):
        if config_path:
            try:
                configs[role] = (Path(config_path), _read_config(Path(config_path), role, listen))
            except SettingsError as e:
                print(f"veil task new: {e}", file=sys.stderr)
                return 2
    served = {}
    if dap is not None:
        from veil.deploy import DeployError
        from veil.grpc_util import is_loopback

        try:
            for role, (config_path, config) in configs.items():
                listen = _serve_dap(role, config_path, config, dap)
                if listen is not None:
                    served[role] = (config_path, listen)
            # Two servers on one machine (a loopback address) need two ports.
            listens = [listen for _, listen in served.values()]
            if len(listens) == 2 and listens[0] == listens[1] and is_loopback(listens[0]):
                raise DeployError(
                    f"the leader and the helper would both serve DAP on {listens[0]}:"
                    " give each DAP endpoint its own port"
                )
        except DeployError as e:
            print(f"veil task new: {e}", file=sys.stderr)
            return 2
    out = Path(args.out)
    tasks = {
        "leader": files.leader,
        "helper": files.helper,
        "collector": files.collector,
        "client": files.client,
    }
    paths = {role: out / f"{args.name}.{role}.toml" for role in tasks}
    # A task's files hold its keys: replacing a running task's would lose its
    # reports to a key nobody has. Anything at a name (a link included) is
    # left alone unless --force, which replaces it and never writes through it.
    taken = [p for p in paths.values() if os.path.lexists(p)]
    if taken and not args.force:
        return _exists(taken[0])
    for role, task in tasks.items():
        try:
            write_toml(paths[role], task.to_dict(), secret=role != "client", replace=args.force)
        except FileExistsError:
            return _exists(paths[role])
        except OSError as e:
            print(f"veil task new: cannot write {paths[role]}: {e.strerror}", file=sys.stderr)
            return 2
    for role, (config_path, config) in configs.items():
        try:
            _add_task_to_config(config_path, config, paths[role])
        except OSError as e:
            print(f"veil task new: cannot write {config_path}: {e.strerror}", file=sys.stderr)
            return 2
    if not dp.has_noise:
        print(
            "veil task new: note: mechanism none publishes exact sums; each aggregator refuses"
            " such a task unless its own config says allow_exact_release = true",
            file=sys.stderr,
        )
    statement = task_statement(dp, vdaf, files.client.noise_added_by)
    if args.json:
        out_json: dict[str, Any] = {
            "task_id": files.client.id_text,
            "files": {role: str(p) for role, p in paths.items()},
            "privacy": statement.to_json(),
        }
        if dap is not None:
            out_json["dap"] = {
                "version": dap.version,
                "task_id_hex": files.client.task_id.hex(),
                "task_configuration": configuration,
            }
        print(json.dumps(out_json, indent=2))
        return 0
    print(f"task {files.client.id_text}")
    for role, p in paths.items():
        print(f"  {role:9} {p}")
    if dap is not None:
        print(f"DAP ({dap.version}): task id {files.client.task_id.hex()} (hex)")
        print(f"  TaskConfiguration {configuration}")
        for role, (config_path, listen) in served.items():
            print(f"  the {role} serves it on {listen} ([dap] listen added to {config_path})")
    print("privacy:")
    for line in statement.lines():
        print(f"  {line}")
    return 0


def _dp_spec(args: argparse.Namespace, local_max_choices: int) -> DpSpec:
    """The [dp] table from the options; a gaussian task gets ρ, solved from ε and δ
    if those are given (the task file always names ρ itself)."""
    from veil.dp.accounting import decimal_text, zcdp_rho
    from veil.dp.mechanisms import MAX_EPSILON, parse_budget
    from veil.task import DpSpec, TaskError

    mechanism = args.mechanism
    epsilon, rho, delta = args.epsilon, args.rho, args.delta
    if mechanism == "gaussian":
        if epsilon is not None and rho is not None:
            raise TaskError("give --rho, or --epsilon and --delta, not both")
        if epsilon is not None:
            if delta is None:
                raise TaskError(
                    "the gaussian mechanism is zCDP: give --rho, or --epsilon with --delta "
                    "(veil solves for the largest ρ that gives (ε, δ)-DP)"
                )
            solved = zcdp_rho(parse_budget(epsilon, "epsilon", MAX_EPSILON), _delta(delta))
            rho = decimal_text(solved)
            epsilon = None
        elif rho is None:
            rho = "1/2"
    else:
        if rho is not None or delta is not None:
            raise TaskError(
                f"--rho and --delta belong to the gaussian mechanism; {mechanism} takes --epsilon"
            )
        if mechanism == "none":
            if epsilon is not None:
                raise TaskError("mechanism none adds no noise and takes no --epsilon")
        elif epsilon is None:
            epsilon = "1"
    return DpSpec(
        mechanism,
        epsilon=epsilon,
        rho=rho,
        delta=delta,
        mode=args.mode,
        split_opt_in=args.split_opt_in,
        fixed_point_bits=args.fixed_point_bits,
        budget=args.budget,
        survey=args.survey,
        survey_budget=args.survey_budget,
        local_epsilon=args.local_epsilon,
        local_max_choices=local_max_choices,
        neighbouring=args.neighbouring,
    )


def _delta(text: str) -> Fraction:
    from veil.task import TaskError

    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise TaskError(f"--delta must be a number, got {text!r}") from None
    if not 0 < value < Fraction(1, 1000):
        raise TaskError(f"--delta must be in (0, 0.001), got {text}")
    return value


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    task = commands.add_parser("task", help="task definitions").add_subparsers(
        dest="task_command", required=True, action=DeferredCommands
    )
    assert isinstance(task, DeferredCommands)
    task.defer("new", _task_new_arguments, help="write matching task files for every party")


def _task_new_arguments(p: argparse.ArgumentParser) -> None:
    from veil.task import (
        DEFAULT_DP_MODE,
        DEFAULT_MAX_CLOCK_SKEW,
        DEFAULT_MIN_BATCH_SIZE,
        DEFAULT_TIME_PRECISION,
        VDAF_TYPES,
    )
    from veil.vdaf import registry

    p.add_argument(
        "--vdaf",
        required=True,
        choices=VDAF_TYPES,
        help="; ".join(
            f"{k.name}: {', '.join('--' + p.replace('_', '-') for p in k.params) or 'no options'}"
            for k in registry.KINDS.values()
        ),
    )
    p.add_argument("--max-measurement", type=int, default=0)
    p.add_argument("--length", type=int, default=0)
    p.add_argument("--chunk-length", type=int, default=0)
    p.add_argument("--max-weight", type=int, default=0)
    p.add_argument("--max-value", type=int, default=0)
    p.add_argument("--leader", required=True, help="leader host:port")
    p.add_argument("--helper", required=True, help="helper host:port")
    p.add_argument(
        "--time-precision",
        type=int,
        default=DEFAULT_TIME_PRECISION,
        help=f"seconds (default {DEFAULT_TIME_PRECISION})",
    )
    p.add_argument(
        "--min-batch-size",
        type=int,
        default=DEFAULT_MIN_BATCH_SIZE,
        help=f"fewest reports a collection may cover (default {DEFAULT_MIN_BATCH_SIZE})",
    )
    p.add_argument(
        "--max-clock-skew",
        type=int,
        default=DEFAULT_MAX_CLOCK_SKEW,
        help=f"seconds (default {DEFAULT_MAX_CLOCK_SKEW})",
    )
    p.add_argument(
        "--report-expiry-age",
        type=int,
        help="seconds after which reports are refused and their data deleted (default: never)",
    )
    p.add_argument(
        "--mechanism",
        default="geometric",
        choices=["geometric", "laplace", "gaussian", "none"],
        help="DP mechanism (default geometric; none publishes exact sums)",
    )
    p.add_argument(
        "--epsilon",
        help="ε per collection, e.g. 1 or 1/2 (default 1); gaussian: with --delta, the"
        " (ε, δ) to solve ρ for",
    )
    p.add_argument("--rho", help="ρ per collection (gaussian, zCDP; default 1/2)")
    p.add_argument(
        "--delta", help="gaussian: the δ of (ε, δ) (default 1e-6 when only --rho is given)"
    )
    p.add_argument(
        "--mode",
        default=DEFAULT_DP_MODE,
        choices=["independent", "split"],
        help="split: each aggregator adds part of the noise (needs --split-opt-in)",
    )
    p.add_argument(
        "--split-opt-in",
        action="store_true",
        help="accept split mode's weaker guarantee against the collector with one aggregator"
        " (that weaker ε is what the ledgers charge)",
    )
    p.add_argument("--fixed-point-bits", type=int, default=0, help="laplace only")
    p.add_argument(
        "--neighbouring",
        default="replace_one",
        choices=["replace_one", "add_remove"],
        help="what DP protects: replacing one report (the report count is published) or"
        " adding/removing one (the count is withheld from the collector)",
    )
    p.add_argument(
        "--budget",
        help="total ε (or ρ) of the task, as charged: split mode charges the weaker ε"
        " (default: one collection's charge)",
    )
    p.add_argument(
        "--local-epsilon",
        help="ε_L of randomized response on each client before sharding: private even "
        "against both aggregators together (default: none)",
    )
    p.add_argument("--survey", help="survey id shared by tasks over the same respondents")
    p.add_argument("--survey-budget", help="total ε (or ρ) of the survey")
    p.add_argument("--name", default="task", help="file name stem")
    p.add_argument("--out", default=".", help="directory for the task files")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace task files of the same name (their task's keys are lost)",
    )
    p.add_argument(
        "--leader-config",
        help="add the task to this leader.toml (created if missing; with --protocol dap, its"
        " [dap] listen too)",
    )
    p.add_argument(
        "--helper-config",
        help="add the task to this helper.toml (created if missing; with --protocol dap, its"
        " [dap] listen too)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the task id, the files written and the privacy statement as JSON",
    )
    add_dap_options(
        p,
        "serve the task over veil's gRPC (default) or over DAP's HTTP (docs/DAP.md);"
        " dap prints the encoded TaskConfiguration another implementation needs",
    )
    p.set_defaults(func=cmd_task_new)

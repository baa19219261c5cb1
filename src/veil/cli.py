"""The `veil` command: servers, task setup, upload and collection."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.task import DpSpec, Task, TaskError, VdafSpec, load_task, new_task, write_toml

if TYPE_CHECKING:  # imported where used, so `veil upload` does not load the servers
    from veil.aggregator.postgres import PostgresDatastore
    from veil.aggregator.server import ServerConfig
    from veil.aggregator.storage import SqliteDatastore


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


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


def _status_printer(quiet: bool) -> Callable[[str], None]:
    """Status lines go to stderr, and not at all with --json."""

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr)

    return say


def _print_results(results: list[Any], as_json: bool) -> None:
    from veil.report import format_table, to_json

    print(to_json(results) if as_json else format_table(results))


def cmd_demo(args: argparse.Namespace) -> int:
    """The example survey, simulated end to end through real servers."""
    from veil.demo import example_survey, run_survey
    from veil.logs import configure_logging

    # The servers log to their own files; here only errors would matter.
    configure_logging("error")
    _tune_for_throughput()
    survey = example_survey()
    say = _status_printer(args.json)
    say(
        f"veil demo: {args.respondents} simulated respondents answer {len(survey.questions)}"
        f" questions (total epsilon {survey.epsilon}, {survey.mechanism} noise)"
    )
    started = time.perf_counter()
    try:
        results = run_survey(survey, args.respondents, progress=not args.no_progress, on_status=say)
    except ValueError as e:
        print(f"veil demo: {e}", file=sys.stderr)
        return 2
    _print_results(results, args.json)
    say(f"done in {time.perf_counter() - started:.1f} s; temporary files removed")
    return 0


def cmd_survey_deploy(args: argparse.Namespace) -> int:
    from veil.deploy import DeployError, deploy_survey
    from veil.survey import SurveyError, load_survey

    try:
        survey = load_survey(args.survey)
        text = Path(args.survey).read_text(encoding="utf-8")
        dep = deploy_survey(
            survey,
            text,
            Path(args.out),
            args.leader,
            args.helper,
            tls=not args.no_tls,
            time_precision=args.time_precision,
        )
    except (SurveyError, DeployError, OSError) as e:
        print(f"veil survey deploy: {e}", file=sys.stderr)
        return 2
    print(f"wrote the deployment of {survey.name!r} ({len(survey.questions)} tasks) to {dep.out}:")
    print(
        f"  {dep.leader_config.parent}/   to the leader's operator:  veil leader --config "
        f"{dep.leader_config}"
    )
    print(
        f"  {dep.helper_config.parent}/   to the helper's operator:  veil helper --config "
        f"{dep.helper_config}"
    )
    print(f"  {dep.collector_dir}/   stays with the survey operator (collector keys and tokens)")
    print(f"  {dep.client_dir}/   public: ships with the client app")
    if not args.no_tls:
        print(
            "Each server directory has an empty tls/ folder: see the README section"
            " 'Deploying a survey across two organisations' for the certificates."
        )
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """A user's survey, simulated end to end through real servers."""
    from fractions import Fraction

    from veil.demo import load, run_survey, with_epsilon
    from veil.logs import configure_logging
    from veil.report import plot_results, plot_sweep
    from veil.survey import SurveyError

    configure_logging("error")
    _tune_for_throughput()
    try:
        survey = load(args.survey)
        if args.epsilon is not None:
            survey = with_epsilon(survey, Fraction(args.epsilon))
    except (SurveyError, ValueError, ZeroDivisionError) as e:
        print(f"veil simulate: {e}", file=sys.stderr)
        return 2
    say = _status_printer(args.json)
    try:
        if args.sweep_epsilon:
            sweep = []
            for eps in args.sweep_epsilon:
                say(f"epsilon = {eps}")
                scaled = with_epsilon(survey, Fraction(eps))
                sweep.append(
                    (float(Fraction(eps)), run_survey(scaled, args.respondents, progress=False))
                )
            out = args.plot or "sweep.png"
            plot_sweep(sweep, out)
            say(f"wrote {out}")
            return 0
        results = run_survey(survey, args.respondents, progress=not args.no_progress, on_status=say)
    except ValueError as e:
        print(f"veil simulate: {e}", file=sys.stderr)
        return 2
    _print_results(results, args.json)
    if args.plot:
        plot_results(results, args.plot)
        say(f"wrote {args.plot}")
    return 0


def _tune_for_throughput() -> None:
    """Process-wide settings for the batched VDAF path (see veil.tuning):
    recycle freed arrays, and one BLAS thread (parallelism is per process)."""
    from veil.tuning import limit_blas_threads, tune_allocator

    tune_allocator()
    limit_blas_threads(1)


def cmd_server(args: argparse.Namespace) -> int:
    from veil.aggregator.server import AggregatorServer, ConfigError, load_config
    from veil.logs import configure_logging

    _tune_for_throughput()
    try:
        config = load_config(Path(args.config))
        configure_logging(args.log_level or config.log_level, config.log_format == "json")
        server = AggregatorServer(args.role, config)
    except (ConfigError, ValueError) as e:
        print(f"veil {args.role}: {e}", file=sys.stderr)
        return 2
    server.serve_forever()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from veil.aggregator.server import AggregationWorker, ConfigError, load_config
    from veil.logs import configure_logging

    try:
        config = load_config(Path(args.config))
        configure_logging(args.log_level or config.log_level, config.log_format == "json")
        worker = AggregationWorker(config, args.metrics)
    except (ConfigError, ValueError) as e:
        print(f"veil worker: {e}", file=sys.stderr)
        return 2
    worker.serve_forever()
    return 0


def _open_database(
    args: argparse.Namespace, command: str
) -> tuple[ServerConfig, SqliteDatastore | PostgresDatastore] | None:
    """(config, store) of the aggregator whose config file is --config."""
    from veil.aggregator.postgres import PostgresDatastore
    from veil.aggregator.server import ConfigError, load_config
    from veil.aggregator.storage import SqliteDatastore

    try:
        config = load_config(Path(args.config))
    except ConfigError as e:
        print(f"veil {command}: {e}", file=sys.stderr)
        return None
    if not isinstance(config.storage, Path):
        return config, PostgresDatastore(config.storage, pool_size=1)
    if not config.storage.exists():
        print(
            f"veil {command}: no database at {config.storage}: start the server once first",
            file=sys.stderr,
        )
        return None
    return config, SqliteDatastore(config.storage)


def _role(args: argparse.Namespace, config: ServerConfig) -> str:
    if args.role:
        return str(args.role)
    # The role is not written in the config; only the leader's tasks hold the
    # aggregator token (to send; the helper holds its hash).
    return "leader" if any(t.aggregator_token for t in config.tasks) else "helper"


def cmd_status(args: argparse.Namespace) -> int:
    from veil.aggregator.status import gather, render_text
    from veil.dp import BudgetLedger

    opened = _open_database(args, "status")
    if opened is None:
        return 2
    config, store = opened
    try:
        from veil.aggregator.postgres import PostgresDatastore, PostgresLedgerStore

        if isinstance(store, PostgresDatastore):
            assert isinstance(config.storage, str)
            ledger = BudgetLedger(PostgresLedgerStore(config.storage, store.pool))
        else:
            ledger = BudgetLedger.sqlite(config.storage)
        status = gather(_role(args, config), config, store, ledger)
    finally:
        store.close()
    print(json.dumps(status, indent=2) if args.json else render_text(status))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    import dataclasses

    from veil.aggregator.maintenance import collect_garbage
    from veil.aggregator.postgres import storage_label
    from veil.logs import configure_logging

    configure_logging("warning")
    opened = _open_database(args, "gc")
    if opened is None:
        return 2
    config, store = opened
    try:
        before = store.size_bytes()
        results = collect_garbage(store, config.tasks, time.time(), full_vacuum=args.vacuum)
        after = store.size_bytes()
    finally:
        store.close()
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
    config, store = opened
    grace = config.keys.grace_seconds if args.grace is None else args.grace
    if grace < 0:
        store.close()
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
        store.close()
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


def _add_task_to_config(path: Path, role: str, task_file: Path, listen: str) -> None:
    if path.exists():
        with path.open("rb") as f:
            config = tomllib.load(f)
    else:
        config = {"listen": listen, "storage": f"{role}.db", "tasks": []}
    rel = os.path.relpath(Path(task_file).resolve(), path.parent.resolve())
    tasks = list(config.get("tasks", []))
    if str(rel) not in tasks:
        tasks.append(str(rel))
    config["tasks"] = tasks
    write_toml(path, config, secret=False)


def cmd_task_new(args: argparse.Namespace) -> int:
    vdaf = VdafSpec(
        args.vdaf,
        max_measurement=args.max_measurement,
        length=args.length,
        chunk_length=args.chunk_length,
        max_weight=args.max_weight,
    )
    try:
        vdaf.instantiate()
    except (ValueError, TypeError) as e:
        print(f"veil task new: bad VDAF parameters: {e}", file=sys.stderr)
        return 2
    try:
        dp = DpSpec(
            args.mechanism,
            epsilon=args.epsilon if args.mechanism in ("geometric", "laplace") else None,
            rho=args.rho if args.mechanism == "gaussian" else None,
            mode=args.mode,
            fixed_point_bits=args.fixed_point_bits,
            budget=args.budget,
            survey=args.survey,
            survey_budget=args.survey_budget,
        )
        dp.plan(vdaf)
    except TaskError as e:
        print(f"veil task new: {e}", file=sys.stderr)
        return 2
    try:
        files = new_task(
            vdaf,
            args.leader,
            args.helper,
            time_precision=args.time_precision,
            min_batch_size=args.min_batch_size,
            max_clock_skew=args.max_clock_skew,
            dp=dp,
            report_expiry_age=args.report_expiry_age,
        )
    except TaskError as e:
        print(f"veil task new: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    paths = {}
    for role, task in (
        ("leader", files.leader),
        ("helper", files.helper),
        ("collector", files.collector),
        ("client", files.client),
    ):
        paths[role] = out / f"{args.name}.{role}.toml"
        write_toml(paths[role], task.to_dict(), secret=role != "client")
    if args.leader_config:
        _add_task_to_config(Path(args.leader_config), "leader", paths["leader"], args.leader)
    if args.helper_config:
        _add_task_to_config(Path(args.helper_config), "helper", paths["helper"], args.helper)
    print(f"task {files.client.id_text}")
    for role, p in paths.items():
        print(f"  {role:9} {p}")
    return 0


def _load(path: str) -> Task:
    try:
        return load_task(Path(path))
    except (OSError, TaskError) as e:
        raise SystemExit(f"veil: {e}") from None


def _read_ca(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def cmd_upload(args: argparse.Namespace) -> int:
    from veil.client import Client, UploadError

    _setup_logging(args.log_level)
    task = _load(args.task)
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
    with Client(
        task,
        root_certificates=_read_ca(args.ca),
        private_key=_read_ca(args.client_key),
        certificate_chain=_read_ca(args.client_cert),
    ) as client:
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


def _number(x: Any) -> Any:
    """A Fraction as an int when whole, else a float (for JSON output)."""
    if isinstance(x, list):
        return [_number(v) for v in x]
    if isinstance(x, Fraction):
        return int(x) if x.denominator == 1 else float(x)
    return x


def cmd_collect(args: argparse.Namespace) -> int:
    from veil.collector import CollectionError, Collector

    _setup_logging(args.log_level)
    task = _load(args.task)
    tp = task.time_precision
    if args.start == "now":
        now = int(time.time())
        start = now - now % tp
    else:
        start = int(args.start)
    duration = args.duration or tp
    with Collector(task, root_certificates=_read_ca(args.ca)) as collector:
        try:
            r = collector.collect(start, duration, wait=args.wait, confidence=args.confidence)
        except CollectionError as e:
            print(f"veil collect: {e}", file=sys.stderr)
            return 1
    print(
        json.dumps(
            {
                "batch": {"start": r.start, "duration": r.duration},
                "report_count": r.report_count,
                "estimate": _number(r.estimate),
                "confidence_interval": {
                    "level": r.confidence,
                    "lower": _number(r.lower),
                    "upper": _number(r.upper),
                },
                "mechanism": r.mechanism,
                "epsilon_spent": str(r.epsilon_spent),
                "seconds": round(r.seconds, 3),
            },
            indent=2,
            default=str,
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="the example survey through a local leader and helper (start here)"
    )
    demo.add_argument("--respondents", type=int, default=10_000)
    demo.add_argument("--json", action="store_true", help="print one JSON list instead")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_demo)

    survey = sub.add_parser("survey", help="survey deployments").add_subparsers(
        dest="survey_command", required=True
    )
    p = survey.add_parser(
        "deploy", help="write leader, helper, collector and client files for a survey"
    )
    p.add_argument("--survey", required=True, help="survey TOML file")
    p.add_argument("--out", required=True, help="new directory for the files")
    p.add_argument("--leader", required=True, help="leader host:port as clients reach it")
    p.add_argument("--helper", required=True, help="helper host:port as the leader reaches it")
    p.add_argument("--time-precision", type=int, default=3600, help="seconds")
    p.add_argument("--no-tls", action="store_true", help="plaintext (only for servers on loopback)")
    p.set_defaults(func=cmd_survey_deploy)

    sim = sub.add_parser("simulate", help="simulate respondents answering your survey")
    sim.add_argument("--survey", required=True, help="survey TOML file")
    sim.add_argument("--respondents", type=int, default=10_000)
    sim.add_argument("--epsilon", help="override the survey's total epsilon")
    sim.add_argument("--plot", help="write a PNG: estimates against truth (or the sweep)")
    sim.add_argument(
        "--sweep-epsilon", nargs="+", metavar="EPS", help="plot error against these epsilons"
    )
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--no-progress", action="store_true")
    sim.set_defaults(func=cmd_simulate)

    for role in ("leader", "helper"):
        p = sub.add_parser(role, help=f"run the {role} aggregator")
        p.add_argument("--config", required=True, help=f"{role}.toml")
        p.add_argument("--log-level", help="debug, info, warning or error (default: config)")
        p.set_defaults(func=cmd_server, role=role)
    p = sub.add_parser(
        "worker",
        help="run leader aggregation and collection workers only (shared PostgreSQL storage)",
    )
    p.add_argument("--config", required=True, help="the leader's leader.toml")
    p.add_argument("--log-level", help="debug, info, warning or error (default: config)")
    p.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve this worker's Prometheus metrics here"
    )
    p.set_defaults(func=cmd_worker)

    task = sub.add_parser("task", help="task definitions").add_subparsers(
        dest="task_command", required=True
    )
    p = task.add_parser("new", help="write matching task files for every party")
    p.add_argument(
        "--vdaf", required=True, choices=["count", "sum", "sumvec", "histogram", "multihot"]
    )
    p.add_argument("--max-measurement", type=int, default=0)
    p.add_argument("--length", type=int, default=0)
    p.add_argument("--chunk-length", type=int, default=0)
    p.add_argument("--max-weight", type=int, default=0)
    p.add_argument("--leader", required=True, help="leader host:port")
    p.add_argument("--helper", required=True, help="helper host:port")
    p.add_argument("--time-precision", type=int, default=3600, help="seconds")
    p.add_argument("--min-batch-size", type=int, default=10)
    p.add_argument("--max-clock-skew", type=int, default=60, help="seconds")
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
    p.add_argument("--epsilon", default="1", help="ε per collection, e.g. 1 or 1/2")
    p.add_argument("--rho", default="1/2", help="ρ per collection (gaussian)")
    p.add_argument("--mode", default="independent", choices=["independent", "split"])
    p.add_argument("--fixed-point-bits", type=int, default=0, help="laplace only")
    p.add_argument("--budget", help="total ε (or ρ) of the task (default: one collection's)")
    p.add_argument("--survey", help="survey id shared by tasks over the same respondents")
    p.add_argument("--survey-budget", help="total ε (or ρ) of the survey")
    p.add_argument("--name", default="task", help="file name stem")
    p.add_argument("--out", default=".", help="directory for the task files")
    p.add_argument("--leader-config", help="add the task to this leader.toml (created if missing)")
    p.add_argument("--helper-config", help="add the task to this helper.toml (created if missing)")
    p.set_defaults(func=cmd_task_new)

    p = sub.add_parser(
        "status", help="an aggregator's tasks, batches, jobs, collections, budgets and keys"
    )
    p.add_argument("--config", required=True, help="the server's leader.toml or helper.toml")
    p.add_argument("--role", choices=["leader", "helper"], help="(default: from the config)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("gc", help="delete expired and collected data now, and report the space")
    p.add_argument("--config", required=True, help="the server's leader.toml or helper.toml")
    p.add_argument(
        "--vacuum", action="store_true", help="rewrite the whole file (briefly blocks writers)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    keys = sub.add_parser("keys", help="an aggregator's HPKE keys").add_subparsers(
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

    p = sub.add_parser("upload", help="upload measurements")
    p.add_argument("--task", required=True, help="the client's task file")
    p.add_argument("values", nargs="*", help="measurements, e.g. 1, 42 or 1,0,3")
    p.add_argument("--file", help="a file with one measurement per line")
    p.add_argument("--time", type=int, help="report time (default: now)")
    p.add_argument("--ca", help="PEM file of the CA that signed the servers' certificates")
    p.add_argument("--client-cert", help="PEM client certificate, for an mTLS aggregator")
    p.add_argument("--client-key", help="PEM key of --client-cert")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser("collect", help="collect a batch")
    p.add_argument("--task", required=True, help="the collector's task file")
    p.add_argument("--start", default="now", help="batch start (epoch seconds) or 'now'")
    p.add_argument("--duration", type=int, help="seconds (default: the time precision)")
    p.add_argument("--wait", type=float, default=300.0)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--ca", help="PEM file of the CA that signed the leader's certificate")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=cmd_collect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())

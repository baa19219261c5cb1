"""For the survey operator: `veil demo`, `veil simulate`, `veil survey deploy`,
`veil survey plan`, `veil survey collect`, `veil survey status` (`veil collect`,
one task's batch, is in collect.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from veil.cli.common import (
    add_dap_options,
    add_retired_ca,
    dap_spec,
    print_results,
    read_pem,
    setup_logging,
    status_printer,
    tune_for_throughput,
)

if TYPE_CHECKING:
    from veil.collector.survey import SurveyFiles
    from veil.deploy import Deployment
    from veil.survey import Survey
    from veil.task import DapSpec


def cmd_demo(args: argparse.Namespace) -> int:
    """The example survey, simulated end to end through real servers."""

    from veil.dp import DPError
    from veil.local.demo import (
        example_points_survey,
        example_survey,
        example_text_survey,
        run_survey,
    )
    from veil.logs import configure_logging
    from veil.render.text import format_local_costs
    from veil.survey.budget import with_local_epsilon
    from veil.survey.plan import local_costs
    from veil.survey.statement import survey_statement

    # The servers log to their own files; here only errors would matter.
    configure_logging("error")
    tune_for_throughput()
    survey = example_survey()
    try:
        if args.local_epsilon is not None:
            survey = with_local_epsilon(survey, _number(args.local_epsilon, "--local-epsilon"))
        costs = local_costs(survey, args.respondents)
    except (DPError, ValueError, ZeroDivisionError) as e:
        print(f"veil demo: {e}", file=sys.stderr)
        return 2
    say = status_printer(args.json)
    say(
        f"veil demo: {args.respondents} simulated respondents answer {len(survey.questions)}"
        f" questions and a breakdown ({survey_statement(survey).against_collector.text()},"
        f" {survey.mechanism} noise)"
    )
    points_survey = example_points_survey()
    say(
        f"veil demo: then a points question of its own survey ({len(points_survey.questions)}"
        f" question, {survey_statement(points_survey).against_collector.text()})"
    )
    text_survey = example_text_survey()
    say(
        f"veil demo: and a text question of its own survey ({len(text_survey.questions)}"
        f" question, {survey_statement(text_survey).against_collector.text()})"
    )
    started = time.perf_counter()
    try:
        results = run_survey(survey, args.respondents, progress=not args.no_progress, on_status=say)
        results += run_survey(
            points_survey, args.respondents, progress=not args.no_progress, on_status=say
        )
        results += run_survey(text_survey, args.respondents, on_status=say)
    except ValueError as e:
        print(f"veil demo: {e}", file=sys.stderr)
        return 2
    print_results(results, args.json)
    if not args.json and args.local_epsilon is not None:
        print()
        print(format_local_costs(costs, args.respondents))
    say(f"done in {time.perf_counter() - started:.1f} s; temporary files removed")
    return 0


def cmd_survey_deploy(args: argparse.Namespace) -> int:
    from veil.cli.invite import issuer_keys_fingerprint
    from veil.deploy import DeployError, deploy_survey
    from veil.survey import SurveyError, load_survey
    from veil.survey.statement import survey_statement
    from veil.task import TaskError
    from veil.times import format_time

    try:
        dap = dap_spec(args)
        survey = load_survey(args.survey)
        text = Path(args.survey).read_text(encoding="utf-8")
    except (TaskError, SurveyError, OSError) as e:
        print(f"veil survey deploy: {e}", file=sys.stderr)
        return 2
    # The plan first: with --strict, a survey that cannot reach its target is
    # refused before anything is written.
    if not _plan_at_deploy(survey, args.strict):
        print("veil survey deploy: nothing was written", file=sys.stderr)
        return 2
    try:
        dep = deploy_survey(
            survey,
            text,
            Path(args.out),
            args.leader,
            args.helper,
            tls=not args.no_tls,
            time_precision=args.time_precision,
            leader_ca=read_pem(args.leader_ca),
            helper_ca=read_pem(args.helper_ca),
            dap=dap,
        )
    except (SurveyError, DeployError, TaskError, OSError) as e:
        print(f"veil survey deploy: {e}", file=sys.stderr)
        return 2
    print(f"wrote the deployment of {survey.name!r} ({len(survey.tasked)} tasks) to {dep.out}:")
    print(
        f"  {dep.leader_config.parent}/   to the leader's operator:  veil leader --config "
        f"{dep.leader_config}"
    )
    print(
        f"  {dep.helper_config.parent}/   to the helper's operator:  veil helper --config "
        f"{dep.helper_config}"
    )
    print(
        f"  {dep.collector_dir}/   stays with the survey operator (collector keys and tokens):"
        f"  veil survey collect --survey-dir {dep.collector_dir} --out results"
    )
    print(
        f"  {dep.client_dir}/   public, for respondents:  veil survey respond --survey-dir"
        f" {dep.client_dir}"
    )
    if survey.invitations:
        issuer = dep.out / "issuer"
        print(
            f"  {issuer}/   stays with the survey operator (the issuer's keys):  veil survey"
            f" invite {dep.out} --count N --out invitations.txt, then veil survey issuer"
            f" --issuer-dir {issuer} --listen HOST:PORT (or veil survey serve --issuer-dir"
            f" {issuer})"
        )
        print(
            f"  issuer keys fingerprint: {issuer_keys_fingerprint(issuer)}  (publish it with"
            " the survey: respondents' clients check the keys they are given against it)"
        )
    else:
        print(
            "no invitations: anyone holding the client files may answer, and more than once;"
            " set invitations = true in [survey] for one answer per respondent"
        )
    if dap is not None:
        _print_dap(dep, dap)
    assert survey.opens is not None and survey.closes is not None
    print(
        f"window: {format_time(survey.opens)} to {format_time(survey.closes)}; collect after it"
        " closes"
    )
    print("privacy (the whole survey, every question composed):")
    checkers = ("leader", "helper") if dap is None else dap.noise_added_by
    for line in survey_statement(survey, checkers).lines():
        print(f"  {line}")
    if survey.mechanism == "none":
        print(
            "mechanism none: exact sums, no DP. Each aggregator refuses to start until its"
            " operator adds allow_exact_release = true to its own config."
        )
    if not args.no_tls:
        print(
            f"TLS: each server's certificate and key go in {dep.leader_config.parent}/tls/"
            f"leader.crt and leader.key, {dep.helper_config.parent}/tls/helper.crt and"
            " helper.key (docs/DEPLOYING.md, 'Deploying a survey across two organisations')."
        )
        if args.leader_ca is None:
            print(
                "No --leader-ca/--helper-ca: the task files pin no CA; respondents must"
                " give each aggregator's CA themselves."
            )
    return 0


def _print_dap(dep: Deployment, dap: DapSpec) -> None:
    """What another DAP implementation needs of each question's task: its id in
    hex and its encoded TaskConfiguration (as `veil task new --protocol dap`)."""
    from veil.task import ClientTask, load_task

    print(
        f"DAP ({dap.version}): the leader at {dap.leader_endpoint}, the helper at"
        f" {dap.helper_endpoint}; each question's task id (hex) and TaskConfiguration:"
    )
    for path in sorted(dep.client_dir.glob("*.toml")):
        task = load_task(path, ClientTask)
        print(f"  {path.stem}: {task.task_id.hex()}")
        print(f"    {task.dap_configuration().encode(dap.dap_version).hex()}")


def cmd_survey_plan(args: argparse.Namespace) -> int:
    """Expected accuracy per question at a number of respondents (veil.survey.plan)."""
    from veil.render.text import format_plan
    from veil.survey import SurveyError, load_survey
    from veil.survey.plan import plan_json, plan_survey, variant_plans

    name = "veil survey plan"
    try:
        survey = load_survey(args.survey)
    except SurveyError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    respondents = args.respondents or survey.expected_respondents
    if respondents is None:
        print(
            f"{name}: give --respondents N, or expected_respondents in the survey's [survey] table",
            file=sys.stderr,
        )
        return 2
    plans = plan_survey(survey, respondents, args.target_error)
    if args.json:
        print(plan_json(survey, plans))
    else:
        print(format_plan(survey, plans, variant_plans(survey, respondents, args.target_error)))
    return 0


def _plan_at_deploy(survey: Survey, strict: bool) -> bool:
    """`veil survey deploy`'s plan at the expected size: the table, and a
    warning naming the questions that miss their target. False: refuse (--strict)."""
    from veil.render.text import format_plan, needs_words
    from veil.survey.plan import plan_survey, variant_plans

    if survey.expected_respondents is None:
        print(
            "plan: set expected_respondents in [survey] to see the expected accuracy per"
            " question here (or run veil survey plan SURVEY --respondents N)"
        )
        return not strict
    plans = plan_survey(survey, survey.expected_respondents)
    print(format_plan(survey, plans, variant_plans(survey, survey.expected_respondents)))
    for p in plans:
        if p.impossible:
            print(
                f"veil survey deploy: warning: {p.question}: {needs_words(survey, p)}",
                file=sys.stderr,
            )
    short = [p.question for p in plans if not p.reaches_target]
    if short:
        what = "refused (--strict)" if strict else "warning"
        print(
            f"veil survey deploy: {what}: at the expected {survey.expected_respondents:,}"
            f" respondents, {', '.join(short)} cannot reach the target accuracy",
            file=sys.stderr,
        )
        return not strict
    return True


def cmd_simulate(args: argparse.Namespace) -> int:
    """A user's survey, simulated end to end through real servers."""

    from veil.dp import DPError
    from veil.local.demo import load, run_survey
    from veil.logs import configure_logging
    from veil.render.plots import plot_results, plot_sweep
    from veil.render.text import format_local_costs, format_sweep
    from veil.survey import SurveyError
    from veil.survey.budget import with_epsilon, with_local_epsilon
    from veil.survey.plan import expected_errors, local_costs

    configure_logging("error")
    tune_for_throughput()
    try:
        survey = load(args.survey)
        if args.epsilon is not None:
            survey = with_epsilon(survey, _number(args.epsilon, "--epsilon"))
        if args.local_epsilon is not None:
            survey = with_local_epsilon(survey, _number(args.local_epsilon, "--local-epsilon"))
        costs = local_costs(survey, args.respondents)
    except (SurveyError, DPError, ValueError, ZeroDivisionError) as e:
        print(f"veil simulate: {e}", file=sys.stderr)
        return 2
    # Without --plot the sweep is printed as a table: nothing is written.
    out: str | None = args.plot
    # Before a simulation of a minute, not after it: a plot that cannot be written.
    if out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "veil simulate: --plot needs matplotlib, an optional extra:"
                " pip install 'veil[plots]'",
                file=sys.stderr,
            )
            return 2
    if out is not None and not Path(out).resolve().parent.is_dir():
        print(
            f"veil simulate: cannot write {out}: no directory {Path(out).parent}", file=sys.stderr
        )
        return 2
    say = status_printer(args.json)
    try:
        if args.sweep_epsilon:
            # Exact, from the noise distribution at each ε: no random run.
            errors = expected_errors(survey, args.respondents, args.sweep_epsilon)
            if out is None:
                print(format_sweep(errors, args.respondents))
                return 0
            plot_sweep(errors, args.respondents, out)
            say(f"wrote {out}")
            return 0
        results = run_survey(survey, args.respondents, progress=not args.no_progress, on_status=say)
    except ValueError as e:
        print(f"veil simulate: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"veil simulate: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print_results(results, args.json)
    if not args.json and any(c.local_epsilon is not None for c in costs):
        print()
        print(format_local_costs(costs, args.respondents))
    if out is not None:
        try:
            plot_results(results, out)
        except OSError as e:
            print(f"veil simulate: cannot write {out}: {e.strerror or e}", file=sys.stderr)
            return 2
        say(f"wrote {out}")
    return 0


def _respondents(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _number(text: str, option: str) -> Fraction:
    """An option's number, exactly; ValueError in our words ("--epsilon: not a
    number: 'one'"), for the command's one-line refusal."""
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{option}: not a number: {text!r}") from None


def _share(text: str) -> Fraction:
    value = _positive_number(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"a share of the range is at most 1, got {text}")
    return value


def _positive_number(text: str) -> Fraction:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def cmd_survey_collect(args: argparse.Namespace) -> int:
    from veil.collector import UnusableTask
    from veil.collector.survey import SurveyCollectError, collect_survey
    from veil.render.text import summary_lines
    from veil.trust import TrustError

    name = "veil survey collect"
    setup_logging(args.log_level)
    out = Path(args.out)
    try:
        outcome = collect_survey(
            Path(args.survey_dir),
            out,
            leader_root_certificates=read_pem(args.leader_ca),
            wait=args.wait,
            confidence=args.confidence,
            say=status_printer(False),
        )
    except (SurveyCollectError, TrustError, UnusableTask, OSError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Every job id was saved before its job was created: nothing is lost.
        print(f"{name}: interrupted: run the same command again to resume", file=sys.stderr)
        return 130
    for line in summary_lines(outcome.results):
        print(line)
    if outcome.elsewhere:
        for qid, why in outcome.elsewhere.items():
            print(f"{name}: {qid}: already collected by another collection: {why}", file=sys.stderr)
        where = outcome.collected_into
        print(
            f"{name}: this survey was collected into {where}: its results are there"
            f" (veil survey collect --out {where} writes them again)"
            if where is not None
            else f"{name}: another run of veil survey collect (another --out directory or"
            " another copy of this collector/ directory) collected it: its results are where"
            " that run wrote them; each question is collected only once",
            file=sys.stderr,
        )
        return 1
    if not outcome.complete:
        for qid, why in outcome.ended.items():
            print(
                f"{name}: {qid} cannot be collected: {why} (each aggregator takes a level of"
                " a batch once: running again cannot collect this question)",
                file=sys.stderr,
            )
        for qid, why in outcome.pending.items():
            print(f"{name}: {qid} not collected yet: {why}", file=sys.stderr)
        if outcome.pending:
            print(
                f"{name}: run the same command again to resume ({out / 'state.json'} keeps the"
                " collection jobs)",
                file=sys.stderr,
            )
        return 1
    print(f"wrote {out / 'results.json'}, {out / 'results.csv'} and {out / 'report.html'}")
    return 0


def cmd_survey_status(args: argparse.Namespace) -> int:
    from veil.collector import CollectionError, Collector, UnusableTask
    from veil.collector.status import QuestionInfo, render_text, survey_status
    from veil.collector.survey import SurveyCollectError, load_collector_dir
    from veil.trust import TrustError

    name = "veil survey status"
    setup_logging(args.log_level)
    try:
        files = load_collector_dir(Path(args.survey_dir))
    except SurveyCollectError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    survey = files.survey
    assert survey.opens is not None and survey.closes is not None
    other = [t for t in files.tasks.values() if t.dap and t.dap.other_implementation == "leader"]
    if other:
        # A veil leader answers GetTaskInfo (gRPC) for its DAP tasks too; DAP
        # itself has no route for what it tells.
        print(
            f"{name}: this survey's leader is another DAP implementation: DAP has no route for"
            " the reports received or the collections done, so veil survey status cannot show"
            " them (its window is in collector/survey.toml; veil survey collect collects it)",
            file=sys.stderr,
        )
        return 2
    infos = {}
    for q in survey.tasked:
        try:
            task = files.tasks[q.id]
            with Collector(task, leader_root_certificates=read_pem(args.leader_ca)) as c:
                info = c.task_info(wait=args.wait)
        except (CollectionError, TrustError, UnusableTask, OSError) as e:
            print(f"{name}: question {q.id!r}: {e}", file=sys.stderr)
            return 1
        infos[q.id] = QuestionInfo(
            info.reports, info.rejected, info.collections_finished, info.counts_withheld
        )
    now = time.time()
    try:
        collecting = _collecting(files, args)
    except (CollectionError, TrustError, OSError) as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 1
    status = survey_status(survey, files.tasks, infos, now, collecting, _collected(args))
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(render_text(status, now, survey.opens, survey.closes))
    return 0


def _collected(args: argparse.Namespace) -> dict[str, int]:
    """Each question's report count in the results `veil survey collect` wrote for
    this collector/ directory (results.json; a text question's also from state.json
    while its levels run); empty if there are none or they cannot be read."""
    from veil.collector.survey import STATE_FILE, collected_into

    where = collected_into(args.survey_dir)
    if where is None:
        return {}
    out: dict[str, int] = {}
    try:
        state = json.loads((where / STATE_FILE).read_text(encoding="utf-8"))
        for qid, text in state.get("text", {}).items():
            out[str(qid)] = int(text["report_count"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    try:
        for result in json.loads((where / "results.json").read_text(encoding="utf-8")):
            if isinstance(result.get("n"), int) and not isinstance(result.get("n"), bool):
                out[str(result["question"])] = result["n"]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return out


def _collecting(files: SurveyFiles, args: argparse.Namespace) -> dict[str, str]:
    """The questions whose collection job, recorded by `veil survey collect` in
    its results directory, is still pending at the leader, and why."""
    from veil.collector import Collector
    from veil.collector.survey import STATE_FILE, State, SurveyCollectError, collected_into

    where = collected_into(args.survey_dir)
    survey = files.survey
    if where is None or survey.opens is None or survey.closes is None:
        return {}
    try:
        recorded = State.load(
            where / STATE_FILE, survey, survey.opens, survey.closes - survey.opens
        )
    except SurveyCollectError:
        return {}
    out = {}
    for q in survey.tasked:
        job = recorded.jobs.get(q.id)
        if job is None or files.tasks[q.id].dap is not None:
            # A DAP question's job is the DAP leader's, which has no call
            # telling a pending job apart without taking its shares: not
            # asked for here (`veil survey collect` polls it).
            continue
        job_id = bytes.fromhex(job)  # State.load checked it
        with Collector(files.tasks[q.id], leader_root_certificates=read_pem(args.leader_ca)) as c:
            state, why = c.job_state(job_id, wait=args.wait)
        if state == "pending":
            out[q.id] = f"retrying: {why}" if why else "pending at the aggregators"
    return out


def register(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    survey: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    demo = commands.add_parser(
        "demo", help="the example survey through a local leader and helper (start here)"
    )
    demo.add_argument(
        "--respondents",
        type=_respondents,
        default=10_000,
        help="simulated respondents, each answering every question (default 10000)",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON list instead")
    demo.add_argument(
        "--local-epsilon",
        help="randomized response at this ε_L on every question, before sharding",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_demo)

    sim = commands.add_parser("simulate", help="simulate respondents answering your survey")
    sim.add_argument("--survey", required=True, help="survey TOML file")
    sim.add_argument(
        "--respondents",
        type=_respondents,
        default=10_000,
        help="simulated respondents, each answering every question (default 10000)",
    )
    sim.add_argument(
        "--epsilon",
        help="override the survey's total ε (a survey composed under zCDP: the ε of its"
        " (ε, δ), solved for ρ at the survey's δ)",
    )
    sim.add_argument(
        "--local-epsilon",
        help="randomized response at this ε_L on every question (overrides the survey's); "
        "the expected error with and without it is printed per question",
    )
    sim.add_argument(
        "--plot",
        help="write a PNG: estimates against truth (or the sweep; without --plot the sweep"
        " is printed as a table)",
    )
    sim.add_argument(
        "--sweep-epsilon",
        nargs="+",
        type=_positive_number,
        metavar="EPS",
        help="plot error against these survey ε (for zCDP: the ε of (ε, δ))",
    )
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--no-progress", action="store_true")
    sim.set_defaults(func=cmd_simulate)

    p = survey.add_parser(
        "deploy", help="write leader, helper, collector and client files for a survey"
    )
    p.add_argument("--survey", required=True, help="survey TOML file")
    p.add_argument("--out", required=True, help="new directory for the files")
    p.add_argument("--leader", required=True, help="leader host:port as clients reach it")
    p.add_argument("--helper", required=True, help="helper host:port as the leader reaches it")
    p.add_argument(
        "--time-precision",
        type=int,
        help="seconds: batch granularity (default: the survey's time_precision, else 3600)",
    )
    p.add_argument("--no-tls", action="store_true", help="plaintext (only for servers on loopback)")
    p.add_argument("--leader-ca", help="PEM: the leader's CA certificate (pinned in task files)")
    p.add_argument("--helper-ca", help="PEM: the helper's CA certificate (pinned in task files)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse (write nothing) when a question cannot reach its target accuracy at the"
        " survey's expected_respondents",
    )
    add_dap_options(
        p,
        "serve every question's task over veil's gRPC (default) or over DAP's HTTP"
        " (docs/DAP.md): each server's config then has [dap] listen at its endpoint's port,"
        " and the tasks' ids and TaskConfigurations are printed",
    )
    p.set_defaults(func=cmd_survey_deploy)

    p = survey.add_parser(
        "plan",
        help="expected accuracy per question at a number of respondents, before deploying",
        description=(
            "For each question: the expected error of its estimates (median and 90th"
            " percentile, in the question's own units: respondents for counts, the answer's"
            " scale for means), the half-width of the 95% interval the results will show, and"
            " the smallest number of respondents at which that interval is narrower than the"
            " target (target_error of the range, default ±10%). Exact, from the noise"
            " distribution: nothing is run."
        ),
    )
    p.add_argument("survey", help="survey TOML file")
    p.add_argument(
        "--respondents",
        type=_respondents,
        help="how many respondents (default: the survey's expected_respondents)",
    )
    p.add_argument(
        "--target-error",
        type=_share,
        help="half the interval's width aimed at, a share of each range (default: the"
        " survey's target_error, else 0.1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(func=cmd_survey_plan)

    p = survey.add_parser(
        "collect",
        help="after the survey closes: collect every question into labelled results",
        description=(
            "Collect every question of a survey over its whole window, once, after the window"
            " has closed. RESULTS/state.json records each collection job before it starts (over"
            " DAP, as soon as the leader names it): if the run stops for any reason, run the"
            " same command again to resume it (no"
            " question is ever collected twice). Writes RESULTS/results.json, results.csv and"
            " report.html."
        ),
    )
    p.add_argument("--survey-dir", required=True, help="the collector/ directory of the deployment")
    p.add_argument("--out", required=True, metavar="RESULTS", help="directory for the results")
    p.add_argument(
        "--wait", type=float, default=300.0, help="seconds to wait for each question (default 300)"
    )
    p.add_argument(
        "--confidence", type=float, default=0.95, help="level of the intervals (default 0.95)"
    )
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    add_retired_ca(p)
    p.add_argument("--log-level", default="warning", help="log level (default warning)")
    p.set_defaults(func=cmd_survey_collect)

    p = survey.add_parser(
        "status", help="reports received per question, the window and the budget spent"
    )
    p.add_argument("--survey-dir", required=True, help="the collector/ directory of the deployment")
    p.add_argument("--leader-ca", help="PEM file of the CA of the leader (only the leader's)")
    p.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the leader")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument("--log-level", default="warning", help="log level (default warning)")
    p.set_defaults(func=cmd_survey_status)

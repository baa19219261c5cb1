"""The observation inventory (veil.observations, src/veil/data/observations.toml)
keeps up with the code: every response field of every RPC a collector's
credentials can call, every error it can be refused with, the JSON keys of
`veil survey status --json` and results.json, every metric and every log field
is classified; docs/OBSERVATIONS.md shows the data as it is. Each check is also
shown failing on a field the inventory does not classify."""

from __future__ import annotations

import ast
import dataclasses
import json
import tomllib
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2

from veil.aggregator import errors
from veil.aggregator.run import dap_helper_http, dap_http
from veil.collector import CollectionResult
from veil.collector.status import QuestionInfo, survey_status
from veil.collector.survey import load_collector_dir
from veil.dap import invitation as dap_invitation
from veil.dap import jobs as dap_jobs
from veil.dap import messages as dap_messages
from veil.dap import pingpong, problems
from veil.deploy import deploy_survey
from veil.dp.accounting import Guarantee
from veil.grpc_util import ERROR_KIND_KEY, RETRY_AFTER_KEY, RETRYABLE_KEY
from veil.metrics import Metrics
from veil.observations import (
    Inventory,
    InventoryError,
    dap_message_fields,
    json_paths,
    load_inventory,
    message_fields,
    parse_inventory,
    render_markdown,
    replace_generated,
    response_fields,
    unclassified,
)
from veil.protocol.v1 import helper_pb2, leader_pb2
from veil.survey import parse_survey
from veil.survey.results import question_result

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "veil" / "data" / "observations.toml"
DOC = ROOT / "docs" / "OBSERVATIONS.md"
SERVICES = (
    leader_pb2.DESCRIPTOR.services_by_name["Leader"],
    helper_pb2.DESCRIPTOR.services_by_name["Helper"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
)

SURVEY = """[survey]
name = "inventory"
epsilon = 2
{extra}opens = "2026-01-01T00:00:00Z"
closes = "2026-01-02T00:00:00Z"
[[question]]
id = "yes"
kind = "yes_no"
[[question]]
id = "number"
kind = "integer"
max = 5
[[question]]
id = "choice"
kind = "choice"
options = ["a", "b", "c"]
[[question]]
id = "many"
kind = "multi_choice"
options = ["x", "y", "z"]
max_choices = 2
[[question]]
id = "vector"
kind = "vector"
length = 2
max = 3
"""
ZCDP = """[survey]
name = "zcdp"
rho = 1
opens = "2026-01-01T00:00:00Z"
closes = "2026-01-02T00:00:00Z"
[[question]]
id = "g"
kind = "yes_no"
mechanism = "gaussian"
rho = 0.5
[[question]]
id = "p"
kind = "choice"
options = ["a", "b"]
local_epsilon = 1
"""
RELATIONS = {"replace_one": "", "add_remove": 'neighbouring = "add_remove"\n'}
BREAKDOWN = """
[[breakdown]]
id = "many_by_choice"
question = "many"
by = "choice"
"""


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return load_inventory()


# --- what a collector observes -----------------------------------------------


def collector_rpc_observations(inv: Inventory) -> list[str]:
    return ["rpc:" + f for f in response_fields(SERVICES, inv.callable_by("collector"))]


def error_observations() -> list[str]:
    def subclasses(cls: type) -> list[type]:
        return [c for s in cls.__subclasses__() for c in (s, *subclasses(s))]

    return sorted({f"error:{c.__name__}" for c in subclasses(errors.AggregatorError)})


def _deployed(tmp: Path, text: str) -> Any:
    survey = parse_survey(text)
    deploy_survey(survey, text, tmp / "dep", "127.0.0.1:1", "127.0.0.1:2", tls=False)
    return load_collector_dir(tmp / "dep" / "collector")


def status_outputs(tmp: Path) -> dict[str, dict[str, Any]]:
    """`veil survey status --json` of each kind of survey, every state."""
    out = {}
    for name, text in [
        *((rel, SURVEY.format(extra=extra)) for rel, extra in RELATIONS.items()),
        ("zcdp", ZCDP),
        ("breakdown", SURVEY.format(extra="") + BREAKDOWN),
    ]:
        files = _deployed(tmp / name, text)
        infos = {q.id: QuestionInfo(7, 1, 1, name == "add_remove") for q in files.survey.tasked}
        for when in (1.7e9, 1.7671e9, 2e9):
            out[f"{name}@{when}"] = survey_status(files.survey, files.tasks, infos, when)
    return out


def _collected(k: int) -> CollectionResult:
    values = [Fraction(10 + i) for i in range(k)]
    return CollectionResult(
        start=0, duration=3600, report_count=20, estimate=values if k > 1 else values[0],
        lower=[v - 3 for v in values] if k > 1 else values[0] - 3,
        upper=[v + 3 for v in values] if k > 1 else values[0] + 3,
        confidence=0.95, intervals="per-coordinate", spent=Fraction(1), unit="epsilon",
        against_collector=Guarantee.pure(Fraction(1)), mechanism="geometric",
        noisy_aggregate=[int(v) for v in values], seconds=0.0,
    )  # fmt: skip


def results_outputs() -> dict[str, list[dict[str, Any]]]:
    """results.json of each kind of question, under both relations and zCDP."""
    out = {}
    for name, text in [
        *((rel, SURVEY.format(extra=extra)) for rel, extra in RELATIONS.items()),
        ("zcdp", ZCDP),
        ("breakdown", SURVEY.format(extra="") + BREAKDOWN),
    ]:
        survey = parse_survey(text)
        results = []
        for q in survey.questions:
            dims = {"yes_no": 1, "integer": 1, "vector": 2}.get(q.kind, len(q.options))
            if q.add_remove:
                dims += 1 if q.kind in ("integer", "vector", "multi_choice") else 0
                dims = max(dims, 2)
            results.append(question_result(q, _collected(dims)).to_json())
        for b in survey.breakdowns:
            results.append(question_result(b, _collected(len(b.cells()))).to_json())
        out[name] = results
    return out


def test_every_rpc_is_listed_with_who_can_call_it(inventory: Inventory) -> None:
    methods = {m.full_name for s in SERVICES for m in s.methods}
    assert sorted(methods - set(inventory.callers)) == [], "add it to `rpcs`"
    assert sorted(set(inventory.callers) - methods) == [], "no such method"


def test_every_field_a_collector_can_reach_is_classified(
    inventory: Inventory, tmp_path: Path
) -> None:
    observed = collector_rpc_observations(inventory)
    assert "rpc:veil.protocol.v1.TaskInfo.reports" in observed  # the walk reaches nested fields
    assert "rpc:veil.protocol.v1.HpkeCiphertext.payload" in observed
    observed += error_observations()
    observed += [
        f"metadata:{ERROR_KIND_KEY}",
        f"metadata:{RETRYABLE_KEY}",
        f"metadata:{RETRY_AFTER_KEY}",
    ]
    for status in status_outputs(tmp_path).values():
        observed += json_paths(status, "json:survey-status")
    for results in results_outputs().values():
        observed += json_paths(results, "json:results")
    assert unclassified(inventory, "collector", observed) == []
    # Nor does the inventory list, for the collector, an RPC field or an error
    # that no longer exists.
    listed = [w for w in inventory.of("collector") if w.startswith(("rpc:", "error:"))]
    assert sorted(set(listed) - set(observed) - {"error:grpc"}) == []


# What each party's credentials call (responses walked) and which methods'
# requests it receives (requests walked).
VIEWS = {
    "collector": ("collector", ()),
    "leader_operator": ("leader", ("veil.protocol.v1.Leader.",)),
    "helper_operator": ("helper", ("veil.protocol.v1.Helper.",)),
    "respondent": ("respondent", ()),
    "page_operator": ("page_operator", ("veil.protocol.v1.Leader.UploadReports",)),
}


def rpc_observations(inv: Inventory, party: str) -> list[str]:
    caller, served = VIEWS[party]
    fields = set(response_fields(SERVICES, inv.callable_by(caller)))
    for service in SERVICES:
        for m in service.methods:
            if m.full_name.startswith(served):
                fields.update(message_fields(m.input_type))
    return sorted("rpc:" + f for f in fields)


@pytest.mark.parametrize("party", sorted(VIEWS))
def test_every_rpc_field_a_party_sees_is_classified(inventory: Inventory, party: str) -> None:
    observed = rpc_observations(inventory, party)
    assert unclassified(inventory, party, observed) == []
    listed = {w for w in inventory.of(party) if w.startswith("rpc:") and not w.endswith("*")}
    assert sorted(listed - set(observed)) == [], "no such field, or not seen by this party"


def test_what_add_remove_withholds_is_withheld(inventory: Inventory, tmp_path: Path) -> None:
    """A key the inventory says a collector cannot observe under add_remove is null
    there, in every state (and present under replace_one)."""
    withheld = {
        w.removeprefix("json:survey-status.questions[].")
        for w, o in inventory.of("collector").items()
        if o.class_under("add_remove") == "not_observable"
        and w.startswith("json:survey-status.questions[].")
    }
    assert withheld == {"reports", "rejected"}
    for name, status in status_outputs(tmp_path).items():
        for q in status["questions"]:
            for key in withheld:
                if name.startswith("add_remove"):
                    assert q[key] is None, (name, q)
                else:
                    assert isinstance(q[key], int), (name, q)


def test_every_metric_and_log_field_is_classified(inventory: Inventory) -> None:
    metrics = {
        f"metric:{m.name.removesuffix('_total')}"
        for m in Metrics("leader").registry.collect()
        if not m.name.startswith(("python_", "process_"))
    }
    assert unclassified(inventory, "leader_operator", metrics) == []
    assert "metric:*" in inventory.of("collector")  # and kept away from the collector
    fields = {"log:time", "log:level", "log:logger", "log:message", "log:exception"}
    for path in (ROOT / "src" / "veil").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # extra= is a dict literal, or a name bound to one in the same module.
        bound = {
            target.id: node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "extra":
                value = node.value
                if isinstance(value, ast.Name):
                    value = bound.get(value.id, value)
                assert isinstance(value, ast.Dict), f"{path}: extra= must be a dict literal"
                for key in value.keys:
                    assert isinstance(key, ast.Constant), f"{path}: extra= keys must be literals"
                    fields.add(f"log:{key.value}")
    assert unclassified(inventory, "leader_operator", fields) == []


def test_every_route_of_the_survey_page_is_classified(inventory: Inventory, tmp_path: Path) -> None:
    from veil.web.app import SurveySite, build_app

    text = SURVEY.format(extra="")
    survey = parse_survey(text)
    deploy_survey(survey, text, tmp_path / "dep", "127.0.0.1:1", "127.0.0.1:2", tls=False)
    app = build_app(SurveySite(tmp_path / "dep" / "client"))
    routes = {
        f"http:{method} {route.path}"
        for route in app.routes
        for method in getattr(route, "methods", None) or ("GET",)
        if method != "HEAD"
    }
    assert "http:POST /reports" in routes
    assert unclassified(inventory, "respondent", routes) == []


# --- DAP over HTTP ---------------------------------------------------------------

# The DAP messages each party receives (decoded, or opened from its own
# sealed share), the route module whose answers it reads, and the one whose
# requests it serves.
DAP_VIEWS: dict[str, tuple[tuple[type, ...], ModuleType | None, ModuleType | None]] = {
    "respondent": ((dap_messages.HpkeConfigList, dap_messages.UploadErrors), dap_http, None),
    # `veil survey serve` for a survey over DAP: the page's DAP reports it
    # relays, and what the leader answers it (veil.web.app).
    "page_operator": (
        (
            dap_messages.Report,
            dap_messages.HpkeConfigList,
            dap_messages.UploadErrors,
            # Read from a report's public extension (a survey with invitations).
            dap_invitation.InvitationExtension,
        ),
        dap_http,
        None,
    ),
    "collector": ((dap_jobs.CollectionJobResp,), dap_http, None),
    "leader_operator": (
        (
            dap_messages.UploadRequest,
            dap_messages.PlaintextInputShare,
            dap_jobs.CollectionJobReq,
            dap_jobs.AggregationJobResp,
            pingpong.PingPong,
            dap_jobs.AggregateShare,
            # Read from a report's public extension (a task with invitations).
            dap_invitation.InvitationExtension,
        ),
        dap_helper_http,
        dap_http,
    ),
    "helper_operator": (
        (
            dap_jobs.AggregationJobInitReq,
            dap_jobs.AggregationJobContinueReq,
            dap_jobs.AggregateShareReq,
            dap_messages.PlaintextInputShare,
            pingpong.PingPong,
            dap_invitation.InvitationExtension,
        ),
        None,
        dap_helper_http,
    ),
}
# Built by each party from its own task files and never sent: the
# associated data of a sealed share and what it holds.
DAP_NOT_SENT = {
    dap_messages.TaskConfiguration,
    dap_messages.VdafConfig,
    dap_messages.InputShareAad,
    dap_jobs.AggregateShareAad,
    problems.Problem,  # sent as its JSON document, walked as json:dap-problem
}


def _dap_dataclasses() -> set[type]:
    return {
        value
        for module in (dap_jobs, dap_messages, pingpong, problems, dap_invitation)
        for value in vars(module).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__.startswith("veil.dap.")
    }


def _headers(module: ModuleType) -> tuple[set[str], set[str]]:
    """The HTTP headers a route module sets on its answers (``headers=``
    dict literals) and reads from requests (``request.headers.get``)."""
    tree = ast.parse(Path(cast(str, module.__file__)).read_text(encoding="utf-8"))
    sent: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "headers":
            keys = node.value.keys if isinstance(node.value, ast.Dict) else []
            sent.update(k.value.lower() for k in keys if isinstance(k, ast.Constant))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "headers"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            read.add(str(node.args[0].value).lower())
    return sent, read


def _routes(module: ModuleType) -> set[str]:
    # The apps only close over their parts, so they are built without them.
    if module is dap_http:
        app = dap_http.dap_app(cast(Any, None), 1, cast(Any, object()))
    else:
        app = dap_helper_http.dap_helper_app(cast(Any, None), 1)
    return {
        f"http:{method} {route.path}"
        for route in app.routes
        for method in getattr(route, "methods", None) or ("GET",)
        if method != "HEAD"
    }


def dap_observations(party: str) -> list[str]:
    received, answers_of, serves = DAP_VIEWS[party]
    observed = {"dap:" + f for m in received for f in dap_message_fields(m)}
    if answers_of is not None:
        every_member = problems.Problem(
            problems.ProblemType.INVALID_MESSAGE, "detail", 400, bytes(32), (1,)
        )
        observed.update(json_paths(json.loads(every_member.to_json()), "json:dap-problem"))
        observed.add("http:status")
        observed.update(f"http:header {h}" for h in _headers(answers_of)[0])
    if serves is not None:
        observed.update(_routes(serves))
        observed.update(f"http:header {h}" for h in _headers(serves)[1])
    return sorted(observed)


@pytest.mark.parametrize("party", sorted(DAP_VIEWS))
def test_every_dap_field_a_party_sees_is_classified(inventory: Inventory, party: str) -> None:
    observed = dap_observations(party)
    assert unclassified(inventory, party, observed) == []
    listed = {w for w in inventory.of(party) if w.startswith(("dap:", "json:dap-problem."))}
    assert sorted(listed - set(observed)) == [], "no such field, or not seen by this party"


def test_every_dap_message_is_seen_by_a_party_or_never_sent() -> None:
    walked = {
        m for received, _, _ in DAP_VIEWS.values() for root in received for m in _walked(root)
    }
    assert sorted(c.__name__ for c in _dap_dataclasses() - walked - DAP_NOT_SENT) == []
    # The walk reaches nested messages and the routes' headers.
    observed = dap_observations("leader_operator")
    assert "dap:ReportMetadata.public_extensions" in observed
    assert "http:header location" in observed and "http:header authorization" in observed
    assert "http:POST /tasks/{task_id}/collection_jobs" in observed


def _walked(root: type) -> set[type]:
    names = {f.split(".")[0] for f in dap_message_fields(root)}
    return {c for c in _dap_dataclasses() if c.__name__ in names}


def test_a_new_dap_field_is_reported(inventory: Inventory) -> None:
    @dataclasses.dataclass(frozen=True)
    class CollectionJobResp:  # as the draft's, with one field more
        report_count: int
        interval: dap_messages.Interval
        reports_span: dap_messages.Interval

    observed = ["dap:" + f for f in dap_message_fields(CollectionJobResp)]
    assert unclassified(inventory, "collector", observed) == ["dap:CollectionJobResp.reports_span"]


# --- the checks fail on what is not classified ------------------------------------


def _synthetic_message() -> Any:
    """A TaskInfo-like answer with one field the inventory has never seen."""
    pool = descriptor_pool.DescriptorPool()
    proto = descriptor_pb2.FileDescriptorProto(name="synthetic.proto", package="veil.protocol.v1")
    message = proto.message_type.add(name="TaskInfo")
    for number, name in enumerate(("reports", "first_report_time"), 1):
        message.field.add(
            name=name,
            number=number,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool.Add(proto)
    return pool.FindMessageTypeByName("veil.protocol.v1.TaskInfo")


def test_an_unclassified_field_is_reported(inventory: Inventory) -> None:
    observed = ["rpc:" + f for f in message_fields(_synthetic_message())]
    assert unclassified(inventory, "collector", observed) == [
        "rpc:veil.protocol.v1.TaskInfo.first_report_time"
    ]
    # An entry ending in .* covers what is under it, not its siblings.
    assert unclassified(inventory, "leader_operator", ["json:veil-status.tasks[].dp.epsilon"]) == []
    assert unclassified(inventory, "leader_operator", ["json:veil-status.tasks[].dpx"]) == [
        "json:veil-status.tasks[].dpx"
    ]
    # A JSON key added to survey status, and an entry removed from the data.
    assert unclassified(inventory, "collector", ["json:survey-status.questions[].last_upload"])
    doc = tomllib.loads(DATA.read_text(encoding="utf-8"))
    doc["observations"] = [
        o
        for o in doc["observations"]
        if (o["party"], o["what"]) != ("collector", "rpc:veil.protocol.v1.TaskInfo.rejected")
    ]
    fewer = parse_inventory(doc)
    assert unclassified(fewer, "collector", collector_rpc_observations(fewer)) == [
        "rpc:veil.protocol.v1.TaskInfo.rejected"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"party": "auditor"}, "unknown party"),
        ({"class": "secret"}, "unknown class 'secret'"),
        ({"add_remove": "hidden"}, "unknown class 'hidden'"),
        ({"class": "dp"}, "names its `budget`"),
        ({"why": ""}, "`why` must be a non-empty string"),
        ({"where": "x"}, "unknown key 'where'"),
    ],
)
def test_malformed_data_is_refused_naming_the_entry(change: dict[str, str], message: str) -> None:
    doc = tomllib.loads(DATA.read_text(encoding="utf-8"))
    doc["observations"][0] = {**doc["observations"][0], **change}
    with pytest.raises(InventoryError, match=r"observations\[0\].*" + message.replace("(", r"\(")):
        parse_inventory(doc)


def test_a_duplicate_and_a_missing_class_are_refused() -> None:
    doc = tomllib.loads(DATA.read_text(encoding="utf-8"))
    doc["observations"].append(doc["observations"][0])
    with pytest.raises(InventoryError, match="listed twice"):
        parse_inventory(doc)
    del doc["classes"]["dp"]
    with pytest.raises(InventoryError, match=r"\[classes\]"):
        parse_inventory(doc)


# --- the document ---------------------------------------------------------------


def test_the_document_shows_the_data(inventory: Inventory) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert replace_generated(text, inventory) == text, (
        "docs/OBSERVATIONS.md is stale: run python scripts/gen_observations.py"
    )
    assert render_markdown(inventory) in text
    # The privacy statement points its readers to it.
    privacy = (ROOT / "docs" / "PRIVACY.md").read_text(encoding="utf-8")
    assert "](OBSERVATIONS.md)" in privacy


def test_every_party_is_covered(inventory: Inventory) -> None:
    for party in inventory.parties:
        assert inventory.of(party), party

"""`veil survey deploy`: every file a two-organisation deployment of a
survey needs, each party's in its own directory.

::

    OUT/leader/      leader.toml, tasks/<question>.toml   (organisation A)
    OUT/helper/      helper.toml, tasks/<question>.toml   (organisation B)
    OUT/collector/   <question>.toml, survey.toml          (the survey operator)
    OUT/client/      <question>.toml, survey.json          (public: ship with the client)
    OUT/issuer/      keys.pem, issuer.db                   (the survey operator; only
                                                            with `invitations = true`)

client/survey.json is the public survey description (`veil.survey.public_description`
documents its format): texts, options, window; collector/survey.toml is the
survey file itself. Every task's validity window is the survey's
[opens, closes), so both aggregators refuse reports outside it and refuse to
close a batch before it closes.

The leader's, helper's and collector's directories and files are created
readable by their owner only (they hold the verify key, tokens and the
collector's HPKE private key); the client files are public. With TLS the
server configs name certificate files under each server's ``tls/`` directory;
each organisation puts its own certificates there.

A survey with `invitations = true` gets one RSA-2048 issuer key per
question (veil.invite): the private keys in issuer/keys.pem, each public key
in its question's task files (all four roles) and survey.json. A key per
question, not one for the survey, so that a token issued for one question
cannot be spent on another: one invitation, at most one report per question.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import tomli_w

from veil.files import create_file
from veil.grpc_util import is_loopback
from veil.survey import DESCRIPTION_FILE, Survey, public_description
from veil.survey.tasks import task_specs
from veil.task import DapSpec, new_task
from veil.trust import TrustError, bundle_fingerprints

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PUBLIC_DIR = 0o755
PUBLIC_FILE = 0o644


class DeployError(ValueError):
    """The output directory or an option cannot be used."""


@dataclass(frozen=True)
class Deployment:
    out: Path
    leader_config: Path
    helper_config: Path
    collector_dir: Path
    client_dir: Path


def write_file(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` from the first byte on (no window in which
    a secret is readable by others); refuses to overwrite or to follow a link."""
    create_file(Path(path), data, mode)


def _toml(path: Path, data: dict[str, Any], mode: int) -> None:
    write_file(path, tomli_w.dumps(data).encode(), mode)


def _ca_pins(tls: bool, leader_ca: bytes | None, helper_ca: bytes | None) -> dict[str, str]:
    """Each aggregator's CA fingerprint; DeployError unless both or neither are
    given, each is one certificate, and they differ."""
    if leader_ca is None and helper_ca is None:
        return {}
    if not tls:
        raise DeployError("--leader-ca/--helper-ca pin TLS certificates: drop --no-tls")
    if leader_ca is None or helper_ca is None:
        raise DeployError("give both --leader-ca and --helper-ca (each aggregator's own CA)")
    pins = {}
    for role, pem in (("leader", leader_ca), ("helper", helper_ca)):
        try:
            found = bundle_fingerprints(pem, f"the {role}'s CA")
        except TrustError as e:
            raise DeployError(str(e)) from None
        if len(found) != 1:
            raise DeployError(f"the {role}'s CA file holds {len(found)} certificates; give one")
        pins[role] = found[0]
    if pins["leader"] == pins["helper"]:
        raise DeployError(
            "the leader's and the helper's CA are the same certificate: each aggregator"
            " needs its own CA, or either could pose as the other"
        )
    return pins


def _dap_listen(
    survey: Survey,
    specs: dict[str, Any],
    dap: DapSpec,
    tls: bool,
    leader: str,
    helper: str,
) -> dict[str, str]:
    """Where each veil aggregator serves DAP (its config's `[dap] listen`):
    the port of its DAP endpoint, on loopback as its gRPC listener is; the
    role another implementation runs gets none. DeployError for a survey
    DAP cannot carry yet or endpoints that do not fit the deployment."""
    from veil.task.spec import DAP_VDAFS

    if survey.invitations and dap.other_implementation == "leader":
        raise DeployError(
            "a survey with invitations cannot have another DAP implementation as its leader:"
            " it would discard every report carrying veil's invitation extension"
        )
    if dap.leader_selected:
        raise DeployError(
            "a survey is collected over its window, a time interval: --batch-mode"
            " leader-selected is not for surveys"
        )
    for qid, (vdaf, _, _) in specs.items():
        if vdaf.type not in DAP_VDAFS:
            raise DeployError(
                f"question {qid!r} is a {vdaf.type} task, which DAP cannot carry yet (DAP"
                f" tasks are {', '.join(DAP_VDAFS)}): deploy the survey without --protocol dap"
            )
    out = {}
    plain = "--no-tls serves plain HTTP" if not tls else "the servers serve TLS"
    for role, url, grpc_address in (
        ("leader", dap.leader_endpoint, leader),
        ("helper", dap.helper_endpoint, helper),
    ):
        if role == dap.other_implementation:
            # That aggregator is not veil: it has no config here.
            _dap_endpoint_port(role, url, tls, plain)
        else:
            out[role] = dap_listen_address(role, url, grpc_address, tls, plain)
    return out


def _dap_endpoint_port(role: str, url: str, tls: bool, why: str) -> int:
    """The port of `role`'s DAP endpoint `url`; DeployError unless it is an
    https URL with `tls` (an http one without), naming a host and a valid
    port (`why` says where TLS comes from)."""
    parts = urlsplit(url)
    want = "https" if tls else "http"
    if parts.scheme != want:
        raise DeployError(f"the {role}'s DAP endpoint {url!r} must be an {want} URL ({why})")
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError:
        raise DeployError(f"the {role}'s DAP endpoint {url!r} has no valid port") from None
    if not parts.hostname:
        raise DeployError(f"the {role}'s DAP endpoint {url!r} names no host")
    return port


def dap_listen_address(role: str, url: str, grpc_listen: str, tls: bool, why: str) -> str:
    """Where a veil aggregator serves DAP (its config's `[dap] listen`) for
    its DAP endpoint `url`: that URL's port, on loopback where the server
    serves plain HTTP or the endpoint names a loopback host, else on every
    interface (serving the config's [tls] certificate). `tls` is whether
    the server serves TLS, and `why` says why it does or does not, for the
    error. DeployError for an endpoint of the other scheme, without a host
    or a valid port, or on the port of the server's gRPC listener
    `grpc_listen`. What `veil survey deploy` and `veil task new` both write."""
    port = _dap_endpoint_port(role, url, tls, why)
    if str(port) == grpc_listen.rpartition(":")[2]:
        raise DeployError(
            f"the {role}'s DAP endpoint {url!r} is on its gRPC port {port}: give each its own"
        )
    local = not tls or is_loopback(f"{urlsplit(url).hostname}:{port}")
    return f"127.0.0.1:{port}" if local else f"0.0.0.0:{port}"


def deploy_survey(
    survey: Survey,
    survey_text: str,
    out: str | os.PathLike[str],
    leader: str,
    helper: str,
    *,
    tls: bool = True,
    time_precision: int | None = None,
    leader_ca: bytes | None = None,
    helper_ca: bytes | None = None,
    dap: DapSpec | None = None,
) -> Deployment:
    """Write the deployment of ``survey`` under ``out`` (which must not exist).

    `time_precision` overrides the survey's; its window must be aligned to it.
    `leader_ca` and `helper_ca` (PEM, one CA certificate each, from each
    organisation) pin each aggregator's CA in every task file
    (`leader_ca_sha256`, `helper_ca_sha256`: clients and the collector then
    trust that CA for that aggregator only, veil.trust) and are copied to
    client/leader-ca.pem, client/helper-ca.pem and the leader's
    tls/helper-ca.crt. With `dap` every question's task is served over DAP
    (its [dap] table, as `veil task new --protocol dap` writes it), and each
    server's config gets `[dap] listen` at its endpoint's port (`_dap_listen`).
    """
    out = Path(out)
    pins = _ca_pins(tls, leader_ca, helper_ca)
    if survey.opens is None or survey.closes is None:
        raise DeployError(
            f"{survey.path}: a deployed survey needs a window: add `opens` and `closes`"
            " (RFC 3339, e.g. opens = 2026-05-01T00:00:00Z) to its [survey] table"
        )
    tp = survey.time_precision if time_precision is None else time_precision
    if tp <= 0 or survey.opens % tp or survey.closes % tp:
        raise DeployError(
            f"the survey window is not aligned to a time precision of {tp} s: batches are"
            " whole intervals"
        )
    for address in (leader, helper):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise DeployError(f"{address!r} is not host:port")
    specs = task_specs(survey)
    dap_listen = {} if dap is None else _dap_listen(survey, specs, dap, tls, leader, helper)
    if out.exists() or out.is_symlink():
        raise DeployError(f"{out} already exists; choose a new directory (nothing is overwritten)")
    dirs = {name: out / name for name in ("leader", "helper", "collector", "client")}
    out.mkdir(parents=True)
    for name, d in dirs.items():
        d.mkdir(mode=PUBLIC_DIR if name == "client" else PRIVATE_DIR)
    for role in ("leader", "helper"):
        (dirs[role] / "tasks").mkdir(mode=PRIVATE_DIR)
    issuer_keys = {}
    if survey.invitations:
        from veil.invite import blindrsa
        from veil.invite.issuer import write_keys

        issuer_keys = {qid: blindrsa.generate_key() for qid in specs}
        (out / "issuer").mkdir(mode=PRIVATE_DIR)
        write_keys(out / "issuer", list(issuer_keys.values()))

    task_names = []
    task_ids = {}
    for qid, (vdaf, dp, kwargs) in specs.items():
        if qid in issuer_keys:
            from veil.invite.token import public_key_bytes

            kwargs = {
                **kwargs,
                "issuer_public_key": public_key_bytes(issuer_keys[qid].public_key()),
            }
        files = new_task(
            vdaf,
            leader,
            helper,
            dp=dp,
            time_precision=tp,
            not_before=survey.opens,
            not_after=survey.closes,
            max_clock_skew=survey.max_clock_skew,
            leader_ca_sha256=pins.get("leader"),
            helper_ca_sha256=pins.get("helper"),
            dap=dap,
            **kwargs,
        )
        task_names.append(qid)
        task_ids[qid] = files.client.id_text
        _toml(dirs["leader"] / "tasks" / f"{qid}.toml", files.leader.to_dict(), PRIVATE_FILE)
        _toml(dirs["helper"] / "tasks" / f"{qid}.toml", files.helper.to_dict(), PRIVATE_FILE)
        _toml(dirs["collector"] / f"{qid}.toml", files.collector.to_dict(), PRIVATE_FILE)
        _toml(dirs["client"] / f"{qid}.toml", files.client.to_dict(), PUBLIC_FILE)
    write_file(dirs["collector"] / "survey.toml", survey_text.encode(), PRIVATE_FILE)
    public = public_description(replace(survey, time_precision=tp), task_ids)
    if issuer_keys:
        from veil.invite.token import key_id, public_key_bytes
        from veil.task import b64e

        for entry in (*public["questions"], *public.get("breakdowns", [])):
            der = public_key_bytes(issuer_keys[entry["id"]].public_key())
            entry["issuer_public_key"] = b64e(der)
            entry["issuer_key_id"] = b64e(key_id(der))
    description = json.dumps(public, indent=2, ensure_ascii=False)
    write_file(dirs["client"] / DESCRIPTION_FILE, description.encode() + b"\n", PUBLIC_FILE)

    for role, listen in (("leader", leader), ("helper", helper)):
        port = listen.rpartition(":")[2]
        config: dict[str, Any] = {
            # A server named by a loopback address (a trial on one machine)
            # listens there only; one with a public name on every interface.
            "listen": f"127.0.0.1:{port}" if not tls or is_loopback(listen) else f"0.0.0.0:{port}",
            "storage": f"{role}.db",
            "tasks": [f"tasks/{name}.toml" for name in task_names],
            # As docs/OPERATING.md says servers log: text lines ("json" for a log shipper).
            "log_format": "text",
        }
        if role in dap_listen:
            config["dap"] = {"listen": dap_listen[role]}
        if tls:
            # Server-authenticated TLS on both servers. The leader proves itself
            # to the helper with its bearer token, as in DAP; requiring client
            # certificates on the helper would also lock out the clients, which
            # fetch the helper's HPKE configuration themselves.
            config["tls"] = {"cert": f"tls/{role}.crt", "key": f"tls/{role}.key"}
            if role == "leader":
                config["helper_tls"] = {"ca": "tls/helper-ca.crt"}
            (dirs[role] / "tls").mkdir(mode=PRIVATE_DIR)
        _toml(dirs[role] / f"{role}.toml", config, PRIVATE_FILE)
    if leader_ca is not None and helper_ca is not None:
        write_file(dirs["client"] / "leader-ca.pem", leader_ca, PUBLIC_FILE)
        write_file(dirs["client"] / "helper-ca.pem", helper_ca, PUBLIC_FILE)
        write_file(dirs["leader"] / "tls" / "helper-ca.crt", helper_ca, PRIVATE_FILE)

    return Deployment(
        out,
        dirs["leader"] / "leader.toml",
        dirs["helper"] / "helper.toml",
        dirs["collector"],
        dirs["client"],
    )

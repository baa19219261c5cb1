"""Task definitions: what a task fixes, and its TOML files for each party.

A task (DAP section 4.2) fixes the VDAF with its parameters, the time
precision, min_batch_size, the validity window, the DP parameters, the
collector's HPKE public key, the aggregators' shared verify key and the bearer
tokens. Parameters are immutable; each party holds only what it needs:

- leader:    everything public, verify key, the aggregator token (to send),
             the SHA-256 of the collector token (to check);
- helper:    everything public, verify key, the SHA-256 of the aggregator token;
- collector: everything public, the collector token and HPKE private key;
- client:    everything public.

Bytes are written as unpadded base64url strings.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import tomllib
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import tomli_w

from veil import vdaf
from veil.dp import DPConfig, DPError, NoisePlan
from veil.hpke import HpkeConfig, HpkeKeypair, generate_keypair
from veil.trust import TrustError, normalise_fingerprint
from veil.vdaf import Prio3

TASK_ID_SIZE = 32
# not_after of a task without an end (DAP leaves task_expiration optional).
OPEN_ENDED = 2**63 - 1
VDAF_TYPES = ("count", "sum", "sumvec", "histogram", "multihot")


class TaskError(ValueError):
    """A task definition is malformed or incomplete for the role reading it."""


def b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64d(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as e:
        raise TaskError(f"not base64url: {text[:16]!r}") from e


def hash_token(token: str) -> bytes:
    """How tokens are stored by the side that checks them."""
    return hashlib.sha256(token.encode()).digest()


def token_matches(token: str, stored_hash: bytes) -> bool:
    return hmac.compare_digest(hash_token(token), stored_hash)


@dataclass(frozen=True)
class VdafSpec:
    """A Prio3 instance by name and parameters (draft-irtf-cfrg-vdaf section 7.4)."""

    type: str
    max_measurement: int = 0
    length: int = 0
    chunk_length: int = 0
    max_weight: int = 0

    def __post_init__(self) -> None:
        if self.type not in VDAF_TYPES:
            raise TaskError(f"unknown VDAF type {self.type!r}; expected one of {VDAF_TYPES}")

    def instantiate(self) -> Prio3[Any, Any]:
        """The veil.vdaf object for two aggregators."""
        if self.type == "count":
            return vdaf.Prio3Count(2)
        if self.type == "sum":
            return vdaf.Prio3Sum(2, self.max_measurement)
        if self.type == "sumvec":
            return vdaf.Prio3SumVec(2, self.length, self.max_measurement, self.chunk_length)
        if self.type == "histogram":
            return vdaf.Prio3Histogram(2, self.length, self.chunk_length)
        return vdaf.Prio3MultihotCountVec(2, self.length, self.max_weight, self.chunk_length)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type}
        for k in ("max_measurement", "length", "chunk_length", "max_weight"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> VdafSpec:
        try:
            return VdafSpec(**d)
        except TypeError as e:
            raise TaskError(f"bad [vdaf] table: {e}") from e


_DP_VDAF_NAMES = {
    "count": "Prio3Count",
    "sum": "Prio3Sum",
    "sumvec": "Prio3SumVec",
    "histogram": "Prio3Histogram",
    "multihot": "Prio3MultihotCountVec",
}


@dataclass(frozen=True)
class DpSpec:
    """DP parameters of a task, interpreted by veil.dp (see `veil.dp.DPConfig`).

    mechanism: geometric (default in `veil task new`), laplace, gaussian or none
    (no noise, no budget: tests and deployments that publish exact sums).
    epsilon (or rho for gaussian) is spent by each collection; budget is the
    task's total (default: one collection's worth per report); survey and
    survey_budget put several tasks over the same respondents under one total.
    """

    mechanism: str = "none"
    epsilon: str | None = None
    rho: str | None = None
    mode: str = "independent"
    fixed_point_bits: int = 0
    budget: str | None = None
    survey: str | None = None
    survey_budget: str | None = None

    def config(self) -> DPConfig:
        try:
            return DPConfig.parse(
                self.mechanism, self.epsilon, self.rho, self.mode, self.fixed_point_bits
            )
        except DPError as e:
            raise TaskError(f"bad [dp] table: {e}") from e

    def plan(self, vdaf: VdafSpec) -> NoisePlan:
        params = {
            k: v
            for k, v in vdaf.to_dict().items()
            if k in ("max_measurement", "length", "max_weight") and v
        }
        try:
            return NoisePlan.for_task(self.config(), _DP_VDAF_NAMES[vdaf.type], params)
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e

    @property
    def amount(self) -> Fraction | None:
        """What one collection spends (ε, or ρ for gaussian); None without noise."""
        c = self.config()
        return c.epsilon if c.epsilon is not None else c.rho

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mechanism": self.mechanism}
        for k in ("epsilon", "rho", "budget", "survey", "survey_budget"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.mode != "independent":
            d["mode"] = self.mode
        if self.fixed_point_bits:
            d["fixed_point_bits"] = self.fixed_point_bits
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> DpSpec:
        def opt(key: str) -> str | None:
            return None if d.get(key) is None else str(d[key])

        unknown = set(d) - {
            "mechanism",
            "epsilon",
            "rho",
            "mode",
            "fixed_point_bits",
            "budget",
            "survey",
            "survey_budget",
        }
        if unknown:
            raise TaskError(f"unknown keys in [dp]: {sorted(unknown)}")
        spec = DpSpec(
            mechanism=str(d.get("mechanism", "none")),
            epsilon=opt("epsilon"),
            rho=opt("rho"),
            mode=str(d.get("mode", "independent")),
            fixed_point_bits=int(d.get("fixed_point_bits", 0)),
            budget=opt("budget"),
            survey=opt("survey"),
            survey_budget=opt("survey_budget"),
        )
        spec.config()
        return spec


@dataclass(frozen=True)
class Task:
    task_id: bytes
    vdaf: VdafSpec
    leader_address: str
    helper_address: str
    time_precision: int = 3600
    min_batch_size: int = 1
    not_before: int = 0
    not_after: int = 2**63 - 1
    max_clock_skew: int = 60
    dp: DpSpec = DpSpec()
    collector_hpke_config: HpkeConfig | None = None
    # Reports older than this many seconds are refused at upload and their
    # data deleted by garbage collection (DAP report_expiry_age); None keeps
    # reports until their batch is collected.
    report_expiry_age: int | None = None
    # SHA-256 fingerprints of each aggregator's CA certificate (veil.trust):
    # clients and collectors then trust that CA for that aggregator only.
    leader_ca_sha256: str | None = None
    helper_ca_sha256: str | None = None
    verify_key: bytes | None = field(default=None, repr=False)
    aggregator_token: str | None = field(default=None, repr=False)
    aggregator_token_hash: bytes | None = None
    collector_token: str | None = field(default=None, repr=False)
    collector_token_hash: bytes | None = None
    collector_hpke_keypair: HpkeKeypair | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if len(self.task_id) != TASK_ID_SIZE:
            raise TaskError(f"task id must be {TASK_ID_SIZE} bytes")
        if self.time_precision <= 0 or self.min_batch_size <= 0:
            raise TaskError("time_precision and min_batch_size must be positive")
        if self.report_expiry_age is not None and self.report_expiry_age <= 0:
            raise TaskError("report_expiry_age must be a positive number of seconds")
        for role in ("leader", "helper"):
            pin = getattr(self, f"{role}_ca_sha256")
            if pin is not None:
                try:
                    object.__setattr__(self, f"{role}_ca_sha256", normalise_fingerprint(pin))
                except TrustError as e:
                    raise TaskError(f"{role}_ca_sha256: {e}") from None
        if self.leader_ca_sha256 is not None and self.leader_ca_sha256 == self.helper_ca_sha256:
            raise TaskError("leader_ca_sha256 and helper_ca_sha256 pin the same certificate")

    def report_horizon(self, now: float) -> int | None:
        """Reports with a time before this are expired (None: reports never expire)."""
        if self.report_expiry_age is None:
            return None
        return int(now) - self.report_expiry_age

    @property
    def id_text(self) -> str:
        return b64e(self.task_id)

    def bucket(self, time: int) -> int:
        """Start of the time_precision-aligned batch bucket holding `time`."""
        return time - time % self.time_precision

    def public(self) -> Task:
        """This task with every secret removed (the client's view)."""
        return Task(
            self.task_id,
            self.vdaf,
            self.leader_address,
            self.helper_address,
            self.time_precision,
            self.min_batch_size,
            self.not_before,
            self.not_after,
            self.max_clock_skew,
            self.dp,
            self.collector_hpke_config,
            self.report_expiry_age,
            self.leader_ca_sha256,
            self.helper_ca_sha256,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "task_id": self.id_text,
            "leader_address": self.leader_address,
            "helper_address": self.helper_address,
            "time_precision": self.time_precision,
            "min_batch_size": self.min_batch_size,
            "not_before": self.not_before,
            "not_after": self.not_after,
            "max_clock_skew": self.max_clock_skew,
            "vdaf": self.vdaf.to_dict(),
            "dp": self.dp.to_dict(),
        }
        if self.collector_hpke_config is not None:
            d["collector_hpke_config"] = {
                "config_id": self.collector_hpke_config.config_id,
                "public_key": b64e(self.collector_hpke_config.public_key),
            }
        if self.report_expiry_age is not None:
            d["report_expiry_age"] = self.report_expiry_age
        for key in ("leader_ca_sha256", "helper_ca_sha256"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.verify_key is not None:
            d["verify_key"] = b64e(self.verify_key)
        if self.aggregator_token is not None:
            d["aggregator_token"] = self.aggregator_token
        if self.aggregator_token_hash is not None:
            d["aggregator_token_sha256"] = b64e(self.aggregator_token_hash)
        if self.collector_token is not None:
            d["collector_token"] = self.collector_token
        if self.collector_token_hash is not None:
            d["collector_token_sha256"] = b64e(self.collector_token_hash)
        if self.collector_hpke_keypair is not None:
            d["collector_hpke_private_key"] = b64e(self.collector_hpke_keypair.private_key)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Task:
        try:
            hc = d.get("collector_hpke_config")
            config = (
                HpkeConfig(int(hc["config_id"]), b64d(hc["public_key"])) if hc is not None else None
            )
            sk = d.get("collector_hpke_private_key")
            keypair = HpkeKeypair(config, b64d(sk)) if sk is not None and config else None

            def opt_bytes(key: str) -> bytes | None:
                return b64d(d[key]) if key in d else None

            def opt_str(key: str) -> str | None:
                return None if d.get(key) is None else str(d[key])

            return Task(
                task_id=b64d(d["task_id"]),
                vdaf=VdafSpec.from_dict(d["vdaf"]),
                leader_address=str(d["leader_address"]),
                helper_address=str(d["helper_address"]),
                time_precision=int(d.get("time_precision", 3600)),
                min_batch_size=int(d.get("min_batch_size", 1)),
                not_before=int(d.get("not_before", 0)),
                not_after=int(d.get("not_after", 2**63 - 1)),
                max_clock_skew=int(d.get("max_clock_skew", 60)),
                dp=DpSpec.from_dict(d.get("dp", {})),
                collector_hpke_config=config,
                report_expiry_age=(
                    None if d.get("report_expiry_age") is None else int(d["report_expiry_age"])
                ),
                leader_ca_sha256=opt_str("leader_ca_sha256"),
                helper_ca_sha256=opt_str("helper_ca_sha256"),
                verify_key=opt_bytes("verify_key"),
                aggregator_token=d.get("aggregator_token"),
                aggregator_token_hash=opt_bytes("aggregator_token_sha256"),
                collector_token=d.get("collector_token"),
                collector_token_hash=opt_bytes("collector_token_sha256"),
                collector_hpke_keypair=keypair,
            )
        except KeyError as e:
            raise TaskError(f"task definition lacks {e.args[0]!r}") from e
        except (TypeError, ValueError, AttributeError) as e:
            # AttributeError: a table where a value belongs, or the reverse.
            if isinstance(e, TaskError):
                raise
            raise TaskError(f"bad task definition: {e}") from e


def load_task(path: Path) -> Task:
    try:
        with path.open("rb") as f:
            return Task.from_dict(tomllib.load(f))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: {e}") from e
    except TaskError as e:
        raise TaskError(f"{path}: {e}") from e


def write_toml(path: Path, data: dict[str, Any], secret: bool) -> None:
    """Write `data` as TOML; a `secret` file is owner-only from its creation.

    Creating the file with mode 0600 (and narrowing a file that existed
    before writing to it) leaves no moment in which the secret is readable
    by others, as writing first and chmod-ing afterwards would.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not secret:
        path.write_bytes(tomli_w.dumps(data).encode())
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(tomli_w.dumps(data).encode())


@dataclass(frozen=True)
class TaskFiles:
    leader: Task
    helper: Task
    collector: Task
    client: Task


def new_task(
    vdaf: VdafSpec,
    leader_address: str,
    helper_address: str,
    *,
    time_precision: int = 3600,
    min_batch_size: int = 1,
    not_before: int = 0,
    not_after: int = 2**63 - 1,
    max_clock_skew: int = 60,
    dp: DpSpec | None = None,
    verify_key_size: int = 32,
    report_expiry_age: int | None = None,
    leader_ca_sha256: str | None = None,
    helper_ca_sha256: str | None = None,
) -> TaskFiles:
    """Fresh ids, keys and tokens, split into each party's view of the task."""
    collector_kp = generate_keypair(secrets.randbelow(256))
    aggregator_token = secrets.token_urlsafe(32)
    collector_token = secrets.token_urlsafe(32)
    base = Task(
        task_id=secrets.token_bytes(TASK_ID_SIZE),
        vdaf=vdaf,
        leader_address=leader_address,
        helper_address=helper_address,
        time_precision=time_precision,
        min_batch_size=min_batch_size,
        not_before=not_before,
        not_after=not_after,
        max_clock_skew=max_clock_skew,
        dp=dp or DpSpec(),
        collector_hpke_config=collector_kp.config,
        report_expiry_age=report_expiry_age,
        leader_ca_sha256=leader_ca_sha256,
        helper_ca_sha256=helper_ca_sha256,
    )
    verify_key = secrets.token_bytes(verify_key_size)
    return TaskFiles(
        leader=replace(
            base,
            verify_key=verify_key,
            aggregator_token=aggregator_token,
            collector_token_hash=hash_token(collector_token),
        ),
        helper=replace(
            base, verify_key=verify_key, aggregator_token_hash=hash_token(aggregator_token)
        ),
        collector=replace(
            base, collector_token=collector_token, collector_hpke_keypair=collector_kp
        ),
        client=base,
    )

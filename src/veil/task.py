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

Each is its own type (`LeaderTask`, `HelperTask`, `CollectorTask`,
`ClientTask`) with its secrets required, and each file declares its role
(`role = "leader"` ...): a file without it is refused with the line to add.

Bytes are written as unpadded base64url strings.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field, fields
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import tomli_w

from veil.dp import (
    DPConfig,
    DPError,
    LocalChannel,
    Mechanism,
    NoiseMode,
    NoisePlan,
    feasible_range,
    local_channel,
)
from veil.dp.accounting import DEFAULT_DELTA, zcdp_rho
from veil.dp.bounds import AggregateBounds, noise_bound
from veil.files import create_file, replace_file
from veil.hpke import HpkeConfig, HpkeKeypair, generate_keypair
from veil.settings import SettingsError, Table, from_mapping, read_toml
from veil.trust import TrustError, normalise_fingerprint
from veil.vdaf import Prio3, registry

TASK_ID_SIZE = 32
# not_after of a task without an end (DAP leaves task_expiration optional).
OPEN_ENDED = 2**63 - 1
VDAF_TYPES = registry.NAMES

# Each default is written here once; the dataclasses, the file reader,
# `new_task` and the `veil task new` options all take it from here.
DEFAULT_TIME_PRECISION = 3600
DEFAULT_NOT_BEFORE = 0
DEFAULT_NOT_AFTER = OPEN_ENDED
DEFAULT_MAX_CLOCK_SKEW = 60
DEFAULT_DP_MODE = "independent"
# What `veil task new` proposes; a task file must state its own.
DEFAULT_MIN_BATCH_SIZE = 10


class TaskError(SettingsError):
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
    """A Prio3 instance by name and parameters (draft-irtf-cfrg-vdaf section 7.4);
    the names and the parameters each takes come from `veil.vdaf.registry`."""

    type: str
    max_measurement: int = 0
    length: int = 0
    chunk_length: int = 0
    max_weight: int = 0

    def __post_init__(self) -> None:
        if self.type not in registry.KINDS:
            raise TaskError(f"unknown VDAF type {self.type!r}; expected one of {VDAF_TYPES}")
        foreign = [p for p in registry.PARAMS if p not in self.kind.params and getattr(self, p)]
        if foreign:
            raise TaskError(
                f"a {self.type} VDAF takes {', '.join(self.kind.params) or 'no parameters'},"
                f" not {', '.join(foreign)}"
            )

    @property
    def kind(self) -> registry.VdafKind:
        return registry.KINDS[self.type]

    @property
    def params(self) -> dict[str, int]:
        """The parameters of this type, by their names in the draft."""
        return {p: getattr(self, p) for p in self.kind.params}

    @property
    def dp_params(self) -> dict[str, int]:
        """The parameters veil.dp derives sensitivities and bounds from (not
        chunk_length, which changes the proof, not the aggregate)."""
        return {k: v for k, v in self.params.items() if k != "chunk_length" and v}

    def instantiate(self) -> Prio3[Any, Any]:
        """The veil.vdaf object for two aggregators."""
        return self.kind.make(self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **self.params}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> VdafSpec:
        return VdafSpec.from_table(from_mapping(d, "<task>", VDAF_KEYS, ("vdaf",)))

    @staticmethod
    def from_table(t: Table) -> VdafSpec:
        name = t.text("type")
        if name not in registry.KINDS:
            raise t.error("type", f"unknown VDAF type {name!r}; expected one of {VDAF_TYPES}")
        # Only the parameters of this type, each required.
        t = Table(t.data, t.source, ("type", *registry.KINDS[name].params), t.path)
        return VdafSpec(name, **{p: t.integer(p, minimum=0) for p in registry.KINDS[name].params})


VDAF_KEYS = ("type", *registry.PARAMS)


DP_KEYS = (
    "mechanism",
    "epsilon",
    "rho",
    "mode",
    "fixed_point_bits",
    "budget",
    "survey",
    "survey_budget",
    "local_epsilon",
    "local_max_choices",
    "delta",
    "split_opt_in",
    "neighbouring",
    "survey_unit",
)
NEIGHBOURING = ("replace_one", "add_remove")


@functools.lru_cache(maxsize=256)
def _solved_rho(epsilon: Fraction, delta: Fraction) -> Fraction:
    return zcdp_rho(epsilon, delta)


BUDGET_UNITS = ("epsilon", "rho")


@dataclass(frozen=True)
class DpSpec:
    """DP parameters of a task, interpreted by veil.dp (see `veil.dp.DPConfig`).

    mechanism: geometric, laplace, gaussian or none (no noise, no budget:
    exact sums, which each aggregator must allow in its own configuration).
    survey and survey_budget put several tasks over the same respondents under
    one total. local_epsilon (issue 19) makes every client randomize its measurement on its
    own device before sharding (veil.dp.local), which protects it even from both
    aggregators together; local_max_choices is how many options a respondent of a
    multihot task may pick (the VDAF's max_weight is then its length, since
    randomized vectors can have any weight).
    epsilon (pure mechanisms) or rho (gaussian; a task file always names ρ itself,
    `veil task new --epsilon E --delta D` solves it) is the noise calibration of
    one collection; delta is the δ at which a ρ is stated as (ε, δ)-DP (default
    10**-6). mode split needs split_opt_in = true: it gives a weaker ε against the
    collector with one aggregator, and that weaker ε is what the ledgers charge,
    so budget is the task's total in the charged unit (default: one collection's
    charge). survey_unit is what the survey counts: epsilon, or rho for a survey
    composed under zCDP, where a pure task's ε counts as ε²/2. neighbouring says
    what one respondent's data is: replace_one (default; the report count is
    published) or add_remove.
    """

    mechanism: str
    epsilon: str | None = None
    rho: str | None = None
    mode: str = DEFAULT_DP_MODE
    fixed_point_bits: int = 0
    budget: str | None = None
    survey: str | None = None
    survey_budget: str | None = None
    local_epsilon: str | None = None
    local_max_choices: int = 0
    delta: str | None = None
    split_opt_in: bool = False
    neighbouring: str = "replace_one"
    survey_unit: str | None = None

    def __post_init__(self) -> None:
        # Without its own total a survey's ledger would silently take this
        # task's budget, and a later task of the survey would fail confusingly.
        if self.survey is not None and self.survey_budget is None:
            raise TaskError(
                f"bad [dp] table: the task names survey {self.survey!r} but no survey_budget"
                " (the survey's total ε or ρ, the same in every task of the survey)"
            )
        if self.survey_budget is not None and self.survey is None:
            raise TaskError("bad [dp] table: survey_budget needs survey (the survey's id)")

    def config(self) -> DPConfig:
        epsilon, rho = self.epsilon, self.rho
        if self.mechanism == "gaussian" and epsilon is not None:
            # A zCDP task stated as (ε, δ): the largest ρ that gives it (CKS20 Cor. 13).
            if rho is not None or self.delta is None:
                raise TaskError(
                    "bad [dp] table: the gaussian mechanism takes rho, or epsilon and delta"
                    " (solved for the largest ρ that gives (ε, δ)-DP), not "
                    + ("both" if rho is not None else "epsilon alone")
                )
            try:
                rho = str(_solved_rho(Fraction(epsilon), self.delta_value))
            except (DPError, ValueError, ZeroDivisionError) as e:
                raise TaskError(f"bad [dp] table: {e}") from e
            epsilon = None
        try:
            config = DPConfig.parse(self.mechanism, epsilon, rho, self.mode, self.fixed_point_bits)
        except DPError as e:
            raise TaskError(f"bad [dp] table: {e}") from e
        if config.mode is NoiseMode.SPLIT and not self.split_opt_in:
            raise TaskError(
                "bad [dp] table: split mode gives a weaker ε against the collector with one "
                "aggregator (and that weaker ε is what is charged); opt in with "
                "split_opt_in = true (--split-opt-in)"
            )
        if self.split_opt_in and config.mode is not NoiseMode.SPLIT:
            raise TaskError('bad [dp] table: split_opt_in applies to mode = "split" only')
        if self.neighbouring not in NEIGHBOURING:
            raise TaskError(
                f"bad [dp] table: neighbouring must be one of {NEIGHBOURING}, "
                f"got {self.neighbouring!r}"
            )
        if self.delta is not None:
            if config.mechanism is not Mechanism.GAUSSIAN:
                raise TaskError("bad [dp] table: delta belongs to the gaussian mechanism (zCDP)")
            delta = self.delta_value
            if not 0 < delta < Fraction(1, 1000):
                raise TaskError(f"bad [dp] table: delta must be in (0, 0.001), got {delta}")
        if self.neighbouring == "add_remove" and self.local_epsilon is not None:
            raise TaskError(
                "bad [dp] table: neighbouring add_remove keeps the report count from the"
                " collector, which the local layer's estimates need; use one or the other"
            )
        if self.neighbouring == "add_remove" and config.mechanism is Mechanism.NONE:
            raise TaskError("bad [dp] table: neighbouring add_remove needs noise (a mechanism)")
        if self.survey_unit is not None and self.survey_unit not in BUDGET_UNITS:
            raise TaskError(f"bad [dp] table: survey_unit must be one of {BUDGET_UNITS}")
        if self.survey_unit == "epsilon" and config.mechanism is Mechanism.GAUSSIAN:
            raise TaskError("bad [dp] table: a gaussian task's survey must count rho")
        return config

    @property
    def delta_value(self) -> Fraction:
        """δ at which ρ is stated (gaussian), DEFAULT_DELTA unless the task names one."""
        if self.delta is None:
            return DEFAULT_DELTA
        try:
            return Fraction(self.delta)
        except (ValueError, ZeroDivisionError) as e:
            raise TaskError(f"bad [dp] table: delta must be a number, got {self.delta!r}") from e

    def plan(self, vdaf: VdafSpec) -> NoisePlan:
        params = vdaf.dp_params
        try:
            return NoisePlan.for_task(
                self.config(), vdaf.kind.prio3, params, neighbouring=self.neighbouring
            )
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e

    def bounds(self, vdaf: VdafSpec) -> AggregateBounds:
        """Where this task's noised aggregates lie, and its largest batch (veil.dp.bounds)."""
        params = vdaf.dp_params
        try:
            report_max = feasible_range(vdaf.kind.prio3, params, 1)[1]
            noise = noise_bound(self.plan(vdaf))
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e
        return AggregateBounds(max(report_max, 1), noise, vdaf.instantiate().field.MODULUS)

    def local(self, vdaf: VdafSpec) -> LocalChannel | None:
        """The randomized response every client applies (None: no local layer)."""
        if self.local_epsilon is None:
            if self.local_max_choices:
                raise TaskError("bad [dp] table: local_max_choices needs local_epsilon")
            return None
        if self.local_max_choices and vdaf.type != "multihot":
            raise TaskError("bad [dp] table: local_max_choices applies to multihot tasks only")
        params = vdaf.dp_params
        try:
            return local_channel(
                vdaf.kind.prio3,
                params,
                self.local_epsilon,
                self.local_max_choices or None,
            )
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e

    def binding(self, vdaf: VdafSpec) -> bytes:
        """The DP parameters that shape an aggregate share's noise and its reading, as
        bytes bound into the HPKE context of the share (`veil.hpke.agg_share_info`).

        Canonical: numbers are exact fractions in lowest terms, so "0.5" and "1/2"
        agree. δ is left out (it only says how a ρ is stated, not what noise is
        added); the local ε_L is in (the collector de-biases for it).
        """
        plan = self.plan(vdaf)
        config = plan.config
        fields = (
            ("mechanism", config.mechanism.value),
            ("mode", config.mode.value),
            ("epsilon", "" if config.epsilon is None else str(config.epsilon)),
            ("rho", "" if config.rho is None else str(config.rho)),
            ("fixed_point_bits", str(config.fixed_point_bits)),
            ("coordinates", str(plan.sensitivity.coordinates)),
            ("per_coordinate", str(plan.sensitivity.per_coordinate)),
            ("neighbouring", self.neighbouring),
            (
                "local_epsilon",
                "" if self.local_epsilon is None else str(Fraction(self.local_epsilon)),
            ),
            ("local_max_choices", str(self.local_max_choices)),
        )
        return ("veil-dp-v1;" + ";".join(f"{k}={v}" for k, v in fields)).encode()

    @property
    def counts_protected(self) -> bool:
        """Whether the number of reports is protected (add_remove): the collector
        is told no count, and the batch floor is tested once per batch."""
        return self.neighbouring == "add_remove"

    def released_count(self, count: int) -> int:
        """The report count the collector is told (and the aggregate shares are bound
        to): the exact count, or 0 under add_remove, where the count itself is
        protected and only noisy aggregates leave the aggregators."""
        return 0 if self.neighbouring == "add_remove" else count

    @property
    def has_noise(self) -> bool:
        """Whether collections are noised and charged (every mechanism but none)."""
        return self.config().mechanism is not Mechanism.NONE

    @property
    def unit(self) -> str | None:
        """What this task's ledger counts: epsilon, rho (gaussian), or None."""
        mech = self.config().mechanism
        if mech is Mechanism.NONE:
            return None
        return "rho" if mech is Mechanism.GAUSSIAN else "epsilon"

    def charge(self, vdaf: VdafSpec) -> Fraction | None:
        """What one collection charges on both ledgers (`NoisePlan.charge`); None
        without noise. In split mode that is the weaker ε against the collector
        with one aggregator, not the configured ε."""
        return self.plan(vdaf).charge

    def total(self, vdaf: VdafSpec) -> Fraction | None:
        """The task's total budget (in `unit`): `budget`, or one collection's charge."""
        charge = self.charge(vdaf)
        if charge is None:
            return None
        return Fraction(self.budget) if self.budget is not None else charge

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mechanism": self.mechanism}
        for k in (
            "epsilon",
            "rho",
            "delta",
            "budget",
            "survey",
            "survey_budget",
            "survey_unit",
            "local_epsilon",
        ):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.local_max_choices:
            d["local_max_choices"] = self.local_max_choices
        if self.mode != DEFAULT_DP_MODE:
            d["mode"] = self.mode
        if self.split_opt_in:
            d["split_opt_in"] = True
        if self.fixed_point_bits:
            d["fixed_point_bits"] = self.fixed_point_bits
        if self.neighbouring != "replace_one":
            d["neighbouring"] = self.neighbouring
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> DpSpec:
        return DpSpec.from_table(from_mapping(d, "<task>", DP_KEYS, ("dp",)))

    @staticmethod
    def from_table(t: Table) -> DpSpec:
        try:
            spec = DpSpec(
                mechanism=t.text("mechanism"),
                epsilon=t.rational("epsilon"),
                rho=t.rational("rho"),
                mode=t.text("mode", DEFAULT_DP_MODE),
                fixed_point_bits=t.integer("fixed_point_bits", 0, minimum=0),
                budget=t.rational("budget"),
                survey=t.optional_text("survey"),
                survey_budget=t.rational("survey_budget"),
                local_epsilon=t.rational("local_epsilon"),
                local_max_choices=t.integer("local_max_choices", 0, minimum=0),
                delta=t.rational("delta"),
                split_opt_in=t.flag("split_opt_in", False),
                neighbouring=t.text("neighbouring", "replace_one"),
                survey_unit=t.optional_text("survey_unit"),
            )
        except TaskError as e:
            raise t.error("survey", str(e)) from None
        try:
            spec.config()
        except TaskError as e:
            raise t.error("mechanism", str(e)) from None
        return spec


# The settings every task file holds, whatever its role.
TASK_KEYS = (
    "role",
    "task_id",
    "leader_address",
    "helper_address",
    "time_precision",
    "min_batch_size",
    "not_before",
    "not_after",
    "max_clock_skew",
    "vdaf",
    "dp",
    "collector_hpke_config",
    "report_expiry_age",
    "leader_ca_sha256",
    "helper_ca_sha256",
    "issuer_public_key",
)
HPKE_CONFIG_KEYS = ("config_id", "public_key")
ROLES = ("leader", "helper", "collector", "client")


@dataclass(frozen=True, kw_only=True)
class Task:
    """What every party knows of a task: its public parameters.

    A task file holds one of the four role types below (`LeaderTask`,
    `HelperTask`, `CollectorTask`, `ClientTask`), each with exactly the
    secrets its party needs, all of them required; the file says which with
    `role = "..."`. Code that needs a secret takes the role type that has it.
    """

    role: ClassVar[str] = "client"
    # The settings this role's file holds beyond TASK_KEYS.
    SECRET_KEYS: ClassVar[tuple[str, ...]] = ()

    task_id: bytes
    vdaf: VdafSpec
    leader_address: str
    helper_address: str
    min_batch_size: int
    dp: DpSpec
    collector_hpke_config: HpkeConfig
    time_precision: int = DEFAULT_TIME_PRECISION
    not_before: int = DEFAULT_NOT_BEFORE
    not_after: int = DEFAULT_NOT_AFTER
    max_clock_skew: int = DEFAULT_MAX_CLOCK_SKEW
    # Reports older than this many seconds are refused at upload and their
    # data deleted by garbage collection (DAP report_expiry_age); None keeps
    # reports until their batch is collected.
    report_expiry_age: int | None = None
    # SHA-256 fingerprints of each aggregator's CA certificate (veil.trust):
    # clients and collectors then trust that CA for that aggregator only.
    leader_ca_sha256: str | None = None
    helper_ca_sha256: str | None = None
    # The invitation issuer's RSA-2048 public key (DER SubjectPublicKeyInfo)
    # for a survey with invitations (veil.invite): every report then carries
    # a token signed under it and bound to its report id. None: no tokens.
    issuer_public_key: bytes | None = None

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
        self.dp.local(self.vdaf)  # a local layer that does not fit the VDAF is refused
        if self.issuer_public_key is not None:
            from veil.invite.token import TokenError, load_public_key

            try:
                load_public_key(self.issuer_public_key)
            except TokenError as e:
                raise TaskError(f"issuer_public_key: {e}") from None

    @property
    def token_size(self) -> int:
        """The bytes of the token each report carries (0: the task takes none)."""
        if self.issuer_public_key is None:
            return 0
        from veil.invite.token import TOKEN_SIZE

        return TOKEN_SIZE

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

    def _public_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(Task)}

    def public(self) -> ClientTask:
        """This task with every secret removed (the client's view)."""
        return ClientTask(**self._public_fields())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "role": self.role,
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
            "collector_hpke_config": {
                "config_id": self.collector_hpke_config.config_id,
                "public_key": b64e(self.collector_hpke_config.public_key),
            },
        }
        if self.report_expiry_age is not None:
            d["report_expiry_age"] = self.report_expiry_age
        for key in ("leader_ca_sha256", "helper_ca_sha256"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.issuer_public_key is not None:
            d["issuer_public_key"] = b64e(self.issuer_public_key)
        d.update(self._secrets())
        return d

    def _secrets(self) -> dict[str, Any]:
        """This role's secrets as written in its file."""
        return {}

    @classmethod
    def _secrets_from(cls, t: Table, config: HpkeConfig) -> dict[str, Any]:
        """This role's secrets read from its file's top-level table."""
        return {}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Task:
        try:
            return Task.from_table(from_mapping(d, "<task>", _ALL_TASK_KEYS))
        except SettingsError as e:
            if isinstance(e, TaskError):
                raise
            raise TaskError(str(e)) from None

    @staticmethod
    def from_table(t: Table) -> Task:
        """The task of the role its table declares; raises SettingsError.

        `t` may hold the keys of any role; those not of the declared role
        are refused (a client file holding a verify key is a mistake).
        """
        role = _declared_role(t)
        cls = _ROLE_TYPES[role]
        t = Table(t.data, t.source, (*TASK_KEYS, *cls.SECRET_KEYS), t.path)
        hc = t.table("collector_hpke_config", HPKE_CONFIG_KEYS, required=True)
        try:
            config = HpkeConfig(hc.integer("config_id", minimum=0), b64d(hc.text("public_key")))
        except (TaskError, ValueError) as e:
            raise hc.error("public_key", f"bad [collector_hpke_config]: {e}") from None
        try:
            vdaf = VdafSpec.from_table(t.table("vdaf", VDAF_KEYS, required=True))
        except TaskError as e:
            raise t.error("vdaf", str(e)) from None
        public: dict[str, Any] = dict(
            task_id=_bytes(t, "task_id"),
            vdaf=vdaf,
            leader_address=t.text("leader_address"),
            helper_address=t.text("helper_address"),
            time_precision=t.integer("time_precision", DEFAULT_TIME_PRECISION),
            min_batch_size=t.integer("min_batch_size"),
            not_before=t.integer("not_before", DEFAULT_NOT_BEFORE),
            not_after=t.integer("not_after", DEFAULT_NOT_AFTER),
            max_clock_skew=t.integer("max_clock_skew", DEFAULT_MAX_CLOCK_SKEW, minimum=0),
            dp=DpSpec.from_table(t.table("dp", DP_KEYS, required=True)),
            collector_hpke_config=config,
            report_expiry_age=t.optional_integer("report_expiry_age"),
            leader_ca_sha256=t.optional_text("leader_ca_sha256"),
            helper_ca_sha256=t.optional_text("helper_ca_sha256"),
            issuer_public_key=(
                _bytes(t, "issuer_public_key") if "issuer_public_key" in t.data else None
            ),
        )
        secrets_ = cls._secrets_from(t, config)
        try:
            return cls(**public, **secrets_)
        except TaskError as e:
            raise t.error(None, str(e)) from None


def _bytes(t: Table, key: str) -> bytes:
    text = t.text(key)
    try:
        return b64d(text)
    except TaskError as e:
        raise t.error(key, f"{key!r}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class ClientTask(Task):
    """A client's task: the public parameters only (safe to publish)."""

    role: ClassVar[str] = "client"


@dataclass(frozen=True, kw_only=True)
class AggregatorTask(Task):
    """What both aggregators hold beyond the public parameters."""

    verify_key: bytes = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class LeaderTask(AggregatorTask):
    """The leader's task: the verify key, the token it sends to the helper and
    the hash of the collector's token it checks."""

    role: ClassVar[str] = "leader"
    SECRET_KEYS: ClassVar[tuple[str, ...]] = (
        "verify_key",
        "aggregator_token",
        "collector_token_sha256",
    )

    aggregator_token: str = field(repr=False)
    collector_token_hash: bytes

    def _secrets(self) -> dict[str, Any]:
        return {
            "verify_key": b64e(self.verify_key),
            "aggregator_token": self.aggregator_token,
            "collector_token_sha256": b64e(self.collector_token_hash),
        }

    @classmethod
    def _secrets_from(cls, t: Table, config: HpkeConfig) -> dict[str, Any]:
        return {
            "verify_key": _bytes(t, "verify_key"),
            "aggregator_token": t.text("aggregator_token"),
            "collector_token_hash": _bytes(t, "collector_token_sha256"),
        }


@dataclass(frozen=True, kw_only=True)
class HelperTask(AggregatorTask):
    """The helper's task: the verify key and the hash of the leader's token."""

    role: ClassVar[str] = "helper"
    SECRET_KEYS: ClassVar[tuple[str, ...]] = ("verify_key", "aggregator_token_sha256")

    aggregator_token_hash: bytes

    def _secrets(self) -> dict[str, Any]:
        return {
            "verify_key": b64e(self.verify_key),
            "aggregator_token_sha256": b64e(self.aggregator_token_hash),
        }

    @classmethod
    def _secrets_from(cls, t: Table, config: HpkeConfig) -> dict[str, Any]:
        return {
            "verify_key": _bytes(t, "verify_key"),
            "aggregator_token_hash": _bytes(t, "aggregator_token_sha256"),
        }


@dataclass(frozen=True, kw_only=True)
class CollectorTask(Task):
    """The collector's task: its bearer token and its HPKE private key."""

    role: ClassVar[str] = "collector"
    SECRET_KEYS: ClassVar[tuple[str, ...]] = ("collector_token", "collector_hpke_private_key")

    collector_token: str = field(repr=False)
    collector_hpke_keypair: HpkeKeypair = field(repr=False)

    def _secrets(self) -> dict[str, Any]:
        return {
            "collector_token": self.collector_token,
            "collector_hpke_private_key": b64e(self.collector_hpke_keypair.private_key),
        }

    @classmethod
    def _secrets_from(cls, t: Table, config: HpkeConfig) -> dict[str, Any]:
        return {
            "collector_token": t.text("collector_token"),
            "collector_hpke_keypair": HpkeKeypair(config, _bytes(t, "collector_hpke_private_key")),
        }


_ROLE_TYPES: dict[str, type[Task]] = {
    "leader": LeaderTask,
    "helper": HelperTask,
    "collector": CollectorTask,
    "client": ClientTask,
}
_ALL_TASK_KEYS = tuple(
    dict.fromkeys(k for cls in _ROLE_TYPES.values() for k in (*TASK_KEYS, *cls.SECRET_KEYS))
)


def _declared_role(t: Table) -> str:
    """The `role` a task file declares. A file without one (written before
    roles were declared) is refused with the line to add: guessing the role
    from which secrets are present would let a misplaced file pass as
    another party's."""
    if "role" not in t:
        guess = next(
            (
                role
                for role in ("leader", "helper", "collector")
                if all(k in t for k in _ROLE_TYPES[role].SECRET_KEYS)
            ),
            "client",
        )
        raise t.error(
            None,
            f'the task file does not say whose it is: add the line role = "{guess}" at its'
            f" top (one of {', '.join(ROLES)}; judging by its secrets it is the {guess}'s)",
        )
    role = t.text("role")
    if role not in ROLES:
        raise t.error("role", f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


T = TypeVar("T", bound=Task)


def load_task(path: str | os.PathLike[str], kind: type[T] = Task) -> T:  # type: ignore[assignment]
    """Read a task file strictly: unknown, missing or mistyped settings are
    refused with their file and line, and so is a file of another role than
    `kind` (e.g. the helper's file given to the leader); raises TaskError only."""
    try:
        task = Task.from_table(read_toml(Path(path), _ALL_TASK_KEYS))
    except SettingsError as e:
        raise TaskError(str(e)) from None
    return expect_role(task, kind, str(path))


def expect_role(task: Task, kind: type[T], where: str = "task") -> T:
    """`task` as `kind`, or TaskError saying whose task it is instead."""
    if not isinstance(task, kind):
        wanted = kind.role if kind in _ROLE_TYPES.values() else "an aggregator"
        raise TaskError(
            f'{where}: this is the {task.role}\'s task file (role = "{task.role}");'
            f" {wanted if wanted == 'an aggregator' else 'the ' + wanted} needs its own"
        )
    return task


def write_toml(
    path: str | os.PathLike[str], data: dict[str, Any], secret: bool, *, replace: bool = True
) -> None:
    """Write `data` as TOML, never through a link at `path` (veil.files).

    A `secret` file is owner-only (0600) from its creation, a public one
    0644. With `replace` False an existing file (or link) at `path` is left
    alone and FileExistsError raised: a task's files hold its keys.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = tomli_w.dumps(data).encode()
    if replace:
        # A public file being replaced keeps its mode (an operator may have narrowed it).
        replace_file(path, text, 0o600 if secret else None)
    else:
        create_file(path, text, 0o600 if secret else 0o644)


@dataclass(frozen=True)
class TaskFiles:
    leader: LeaderTask
    helper: HelperTask
    collector: CollectorTask
    client: ClientTask


def new_task(
    vdaf: VdafSpec,
    leader_address: str,
    helper_address: str,
    *,
    min_batch_size: int,
    dp: DpSpec,
    time_precision: int = DEFAULT_TIME_PRECISION,
    not_before: int = DEFAULT_NOT_BEFORE,
    not_after: int = DEFAULT_NOT_AFTER,
    max_clock_skew: int = DEFAULT_MAX_CLOCK_SKEW,
    verify_key_size: int = 32,
    report_expiry_age: int | None = None,
    leader_ca_sha256: str | None = None,
    helper_ca_sha256: str | None = None,
    issuer_public_key: bytes | None = None,
) -> TaskFiles:
    """Fresh ids, keys and tokens, split into each party's view of the task."""
    collector_kp = generate_keypair(secrets.randbelow(256))
    aggregator_token = secrets.token_urlsafe(32)
    collector_token = secrets.token_urlsafe(32)
    client = ClientTask(
        task_id=secrets.token_bytes(TASK_ID_SIZE),
        vdaf=vdaf,
        leader_address=leader_address,
        helper_address=helper_address,
        time_precision=time_precision,
        min_batch_size=min_batch_size,
        not_before=not_before,
        not_after=not_after,
        max_clock_skew=max_clock_skew,
        dp=dp,
        collector_hpke_config=collector_kp.config,
        report_expiry_age=report_expiry_age,
        leader_ca_sha256=leader_ca_sha256,
        helper_ca_sha256=helper_ca_sha256,
        issuer_public_key=issuer_public_key,
    )
    public = client._public_fields()
    verify_key = secrets.token_bytes(verify_key_size)
    return TaskFiles(
        leader=LeaderTask(
            **public,
            verify_key=verify_key,
            aggregator_token=aggregator_token,
            collector_token_hash=hash_token(collector_token),
        ),
        helper=HelperTask(
            **public, verify_key=verify_key, aggregator_token_hash=hash_token(aggregator_token)
        ),
        collector=CollectorTask(
            **public, collector_token=collector_token, collector_hpke_keypair=collector_kp
        ),
        client=client,
    )

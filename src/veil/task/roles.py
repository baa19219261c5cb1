"""The task as each party holds it: `Task` (the public parameters, what a
client needs) and one type per role with that role's secrets (`LeaderTask`,
`HelperTask`, `CollectorTask`; `ClientTask` has none). A task file declares
its role, and is read as that role's type only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from veil.dap.messages import (
    BatchMode,
    Extension,
    Interval,
    TaskConfiguration,
    VdafConfig,
    task_interval_extension,
)
from veil.dp import NoisePlan
from veil.dp.mechanisms import AGGREGATORS
from veil.hpke import HpkeConfig, HpkeKeypair
from veil.settings import SettingsError, Table, from_mapping
from veil.task.common import (
    DEFAULT_MAX_CLOCK_SKEW,
    DEFAULT_NOT_AFTER,
    DEFAULT_NOT_BEFORE,
    DEFAULT_TIME_PRECISION,
    TASK_ID_SIZE,
    TaskError,
    b64d,
    b64e,
)
from veil.task.spec import DAP_KEYS, DAP_VDAFS, DP_KEYS, VDAF_KEYS, DapSpec, DpSpec, VdafSpec
from veil.trust import TrustError, normalise_fingerprint

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
    "dap",
)
HPKE_CONFIG_KEYS = ("config_id", "public_key")
ROLES = ("leader", "helper", "collector", "client")


def retirement_margin(time_precision: int, max_clock_skew: int) -> int:
    """How near its expiry the oldest report of a leader-selected batch may
    come before veil's leader retires the batch (takes no job into it): the
    larger of the task's time precision and its max_clock_skew
    (veil.aggregator.store.batches.joinable_from says why)."""
    return max(time_precision, max_clock_skew)


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
    # a token signed under it and bound to the report's content
    # (veil.invite.token.report_context). None: no tokens.
    issuer_public_key: bytes | None = None
    # Served over DAP (its [dap] table; docs/DAP.md) rather than veil's gRPC
    # protocol; None: a veil task.
    dap: DapSpec | None = None

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
        if self.dap is not None:
            if self.vdaf.type not in DAP_VDAFS:
                raise TaskError(
                    f"a {self.vdaf.type} task cannot be served over DAP yet; DAP tasks are"
                    f" {', '.join(DAP_VDAFS)}"
                )
            if self.issuer_public_key is not None and self.dap.other_implementation == "leader":
                raise TaskError(
                    "a task with invitations cannot have another DAP implementation as its"
                    " leader: it would discard every report carrying veil's invitation extension"
                    " (docs/DAP.md, 'Invitations over DAP')"
                )
            self._check_batch_retirement()
            if self.dap.other_implementation is not None and self.dp.mode == "split":
                raise TaskError(
                    f"split mode halves the noise between two veil aggregators; the"
                    f" {self.dap.other_implementation} here is another DAP implementation,"
                    " which adds none: use independent mode (veil's side then adds the whole"
                    " noise)"
                )

    def _check_batch_retirement(self) -> None:
        """veil's leader retires a leader-selected batch once its oldest
        report is within a margin of expiry, the larger of time_precision and
        max_clock_skew (veil.aggregator.store.batches.joinable_from): an
        expiry no larger than that retires every batch as it is made, short
        of min_batch_size unless its first job fills it. Another
        implementation's leader has its own rule."""
        age = self.report_expiry_age
        if age is None or self.dap is None or not self.dap.leader_selected:
            return
        if self.dap.other_implementation == "leader":
            return
        margin = retirement_margin(self.time_precision, self.max_clock_skew)
        if age <= margin:
            raise TaskError(
                f"report_expiry_age = {age} is no larger than the larger of time_precision ="
                f" {self.time_precision} and max_clock_skew = {self.max_clock_skew}: the leader"
                f" of a leader-selected task retires a batch once its oldest report is within"
                f" {margin} s of expiry, so every batch would retire as it is made; set"
                f" report_expiry_age well above {margin} (a batch takes reports for"
                " report_expiry_age less that margin), lower time_precision or max_clock_skew,"
                " or leave report_expiry_age unset"
            )

    @property
    def noise_added_by(self) -> tuple[str, ...]:
        """The aggregator roles that add DP noise: both, unless another DAP
        implementation runs one of them (it adds none)."""
        return ("leader", "helper") if self.dap is None else self.dap.noise_added_by

    def noise_plan(self) -> NoisePlan:
        """The noise of one collection as the collector receives it: the
        task's plan, drawn by each aggregator in `noise_added_by`."""
        plan = self.dp.plan(self.vdaf)
        if len(self.noise_added_by) == AGGREGATORS:
            return plan
        return replace(plan, noising=len(self.noise_added_by))

    @property
    def invitation_private(self) -> bool:
        """Whether a DAP report's invitation extension rides in the leader's
        input share, private to it, rather than in the report's public
        extensions: with another implementation as the helper, which knows
        no such extension and would refuse the report (docs/DAP.md)."""
        return (
            self.issuer_public_key is not None
            and self.dap is not None
            and self.dap.other_implementation == "helper"
        )

    @property
    def token_size(self) -> int:
        """The bytes of the token each report carries (0: the task takes none)."""
        if self.issuer_public_key is None:
            return 0
        from veil.invite.token import TOKEN_SIZE

        return TOKEN_SIZE

    def dap_configuration(self) -> TaskConfiguration:
        """The task as DAP binds it into every share's associated data
        (draft-ietf-ppm-dap section 4.2); only for a task with a [dap]
        table. The window the task was created with (its [dap] table's
        task_interval; else [not_before, not_after), when bounded) is the
        task_interval extension, widened to whole time precisions."""
        if self.dap is None:
            raise TaskError("this task is not served over DAP (no [dap] table)")
        vdaf = VdafConfig(DAP_VDAFS[self.vdaf.type], tuple(self.vdaf.params.items()))
        extensions: tuple[Extension, ...] = ()
        window = self.dap.task_interval
        if window is None and (
            self.not_before != DEFAULT_NOT_BEFORE or self.not_after != DEFAULT_NOT_AFTER
        ):
            window = (self.not_before, self.not_after)
        if window is not None:
            start = window[0] // self.time_precision
            end = -(-window[1] // self.time_precision)
            extensions = (task_interval_extension(Interval(start, end - start)),)
        return TaskConfiguration(
            task_info=self.dap.task_info.encode(),
            leader_aggregator_endpoint=self.dap.leader_endpoint.encode(),
            helper_aggregator_endpoint=self.dap.helper_endpoint.encode(),
            time_precision=self.time_precision,
            min_batch_size=self.min_batch_size,
            batch_mode=(
                BatchMode.LEADER_SELECTED if self.dap.leader_selected else BatchMode.TIME_INTERVAL
            ),
            vdaf_type=vdaf.vdaf_type,
            vdaf_configuration=vdaf.encode(),
            extensions=extensions,
        )

    def report_horizon(self, now: float) -> int | None:
        """Reports with a time before this are expired (None: reports never expire)."""
        if self.report_expiry_age is None:
            return None
        return int(now) - self.report_expiry_age

    @property
    def id_text(self) -> str:
        return b64e(self.task_id)

    @property
    def window(self) -> tuple[int, int]:
        """The report times the task accepts: [not_before, not_after)."""
        return self.not_before, self.not_after

    def same_but_window(self, other: Task) -> bool:
        """Whether `other` is this task with at most its window changed (a
        survey closed early or extended: veil survey close, veil survey
        extend); the window is the one parameter an organisation changes."""
        return type(other) is type(self) and (
            replace(other, not_before=self.not_before, not_after=self.not_after) == self
        )

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
        if self.dap is not None:
            d["dap"] = self.dap.to_dict()
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
            return Task.from_table(from_mapping(d, "<task>", ALL_TASK_KEYS))
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
        cls = ROLE_TYPES[role]
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
            dap=(DapSpec.from_table(t.table("dap", DAP_KEYS)) if "dap" in t.data else None),
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


ROLE_TYPES: dict[str, type[Task]] = {
    "leader": LeaderTask,
    "helper": HelperTask,
    "collector": CollectorTask,
    "client": ClientTask,
}
ALL_TASK_KEYS = tuple(
    dict.fromkeys(k for cls in ROLE_TYPES.values() for k in (*TASK_KEYS, *cls.SECRET_KEYS))
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
                if all(k in t for k in ROLE_TYPES[role].SECRET_KEYS)
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

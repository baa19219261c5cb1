"""What a task computes and how it is protected: the VDAF by name and
parameters (`VdafSpec`), the differential privacy settings (`DpSpec`) and,
for a task served over DAP, what DAP binds of it (`DapSpec`), each read from
and written to its table of a task file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from veil.dap import DapVersion
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
from veil.dp.heavy_hitters import MAX_TEXT_BYTES, HeavyHittersPlan
from veil.settings import Table, from_mapping
from veil.task.common import ALL_VDAF_TYPES, DEFAULT_DP_MODE, MAX_QUERY_PREFIXES, TaskError
from veil.vdaf import Prio3, registry
from veil.vdaf.spec.poplar1 import Poplar1


@dataclass(frozen=True)
class VdafSpec:
    """A VDAF instance by name and parameters: a Prio3 type (draft-irtf-cfrg-vdaf
    section 7.4) or Poplar1 (section 8, `type = "poplar1"` with `bits`); the names
    and the parameters each takes come from `veil.vdaf.registry`."""

    type: str
    max_measurement: int = 0
    length: int = 0
    chunk_length: int = 0
    max_weight: int = 0
    bits: int = 0
    max_value: int = 0

    def __post_init__(self) -> None:
        if self.type not in ALL_VDAF_TYPES:
            raise TaskError(f"unknown VDAF type {self.type!r}; expected one of {ALL_VDAF_TYPES}")
        own = self.param_names
        foreign = [p for p in (*registry.PARAMS, "bits") if p not in own and getattr(self, p)]
        if foreign:
            raise TaskError(
                f"a {self.type} VDAF takes {', '.join(own) or 'no parameters'},"
                f" not {', '.join(foreign)}"
            )
        if self.is_prefix and not (0 < self.bits <= 8 * MAX_TEXT_BYTES and self.bits % 8 == 0):
            raise TaskError(
                "a poplar1 VDAF's bits must be a positive multiple of 8 (one byte per level)"
                f" up to {8 * MAX_TEXT_BYTES}, got {self.bits}"
            )

    @property
    def is_prefix(self) -> bool:
        """Whether the VDAF is queried with an aggregation parameter (Poplar1)."""
        return self.type in registry.PREFIX_KINDS

    @property
    def param_names(self) -> tuple[str, ...]:
        if self.is_prefix:
            return registry.PREFIX_KINDS[self.type].params
        return registry.KINDS[self.type].params

    @property
    def kind(self) -> registry.VdafKind:
        """The Prio3 type (TaskError for Poplar1, which is no Prio3 type)."""
        if self.is_prefix:
            raise TaskError(f"a {self.type} task is not a Prio3 task")
        return registry.KINDS[self.type]

    @property
    def params(self) -> dict[str, int]:
        """The parameters of this type, by their names in the draft."""
        return {p: getattr(self, p) for p in self.param_names}

    @property
    def max_bytes(self) -> int:
        """A Poplar1 task's string length in bytes (its number of levels queried)."""
        return self.bits // 8

    @property
    def dp_params(self) -> dict[str, int]:
        """The parameters veil.dp derives sensitivities and bounds from (not
        chunk_length, which changes the proof, not the aggregate)."""
        return {k: v for k, v in self.params.items() if k != "chunk_length" and v}

    def instantiate(self) -> Prio3[Any, Any]:
        """The veil.vdaf object for two aggregators (a Prio3 type)."""
        return self.kind.make(self.params)

    def instantiate_poplar1(self) -> Poplar1:
        """The Poplar1 object of a poplar1 task, bounding each query's prefixes
        by MAX_QUERY_PREFIXES."""
        if not self.is_prefix:
            raise TaskError(f"a {self.type} task is not a Poplar1 task")
        return Poplar1(self.bits, max_prefixes=MAX_QUERY_PREFIXES)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **self.params}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> VdafSpec:
        return VdafSpec.from_table(from_mapping(d, "<task>", VDAF_KEYS, ("vdaf",)))

    @staticmethod
    def from_table(t: Table) -> VdafSpec:
        name = t.text("type")
        if name in registry.PREFIX_KINDS:
            params = registry.PREFIX_KINDS[name].params
        elif name in registry.KINDS:
            params = registry.KINDS[name].params
        else:
            raise t.error("type", f"unknown VDAF type {name!r}; expected one of {ALL_VDAF_TYPES}")
        # Only the parameters of this type, each required.
        t = Table(t.data, t.source, ("type", *params), t.path)
        return VdafSpec(name, **{p: t.integer(p, minimum=0) for p in params})


VDAF_KEYS = ("type", *registry.PARAMS, "bits")

# The VDAFs a task may serve over DAP: those with a configuration encoding in
# draft-ietf-ppm-dap's appendix, and the draft's parameter names for them.
DAP_VDAFS = {
    "count": "Prio3Count",
    "sum": "Prio3Sum",
    "sumvec": "Prio3SumVec",
    "histogram": "Prio3Histogram",
    "multihot": "Prio3MultihotCountVec",
}
DAP_KEYS = (
    "version",
    "task_info",
    "leader_endpoint",
    "helper_endpoint",
    "other_implementation",
    "batch_mode",
    "task_interval_start",
    "task_interval_end",
)
# The aggregator roles another DAP implementation may play beside a veil one.
OTHER_IMPLEMENTATION_ROLES = ("leader", "helper")
# DAP's batch modes by the draft's names (section 5): the collector names a
# time interval, or the leader chooses each batch.
TIME_INTERVAL = "time-interval"
LEADER_SELECTED = "leader-selected"
BATCH_MODES = (TIME_INTERVAL, LEADER_SELECTED)


@dataclass(frozen=True)
class DapSpec:
    """A task served over DAP (docs/DAP.md): the draft it speaks and the
    fields of DAP's TaskConfiguration that veil's task does not already
    hold. The endpoints are the aggregators' DAP base URLs, kept exactly as
    written: they enter every share's associated data byte for byte."""

    leader_endpoint: str
    helper_endpoint: str
    version: str = DapVersion.DAP_19.value
    task_info: str = ""
    # The aggregator role ("leader" or "helper") run by another DAP
    # implementation, which adds no DP noise (DAP itself adds none); None: both
    # aggregators are veil. veil's side then adds the whole noise (docs/DAP.md).
    other_implementation: str | None = None
    # How reports are grouped into batches: by time (the collector names an
    # interval) or by the leader (each batch a 32-byte id it chooses).
    batch_mode: str = TIME_INTERVAL
    # The window the task was created with, [start, end) in seconds: DAP's
    # task_interval extension, bound into every share's associated data, so
    # it stays as created when `veil survey close` or `extend` moves the
    # window veil's aggregators enforce (None: from the window, where bounded).
    task_interval: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.batch_mode not in BATCH_MODES:
            raise TaskError(
                f"batch_mode must be one of {', '.join(BATCH_MODES)}, got {self.batch_mode!r}"
            )
        other = self.other_implementation
        if other is not None and other not in OTHER_IMPLEMENTATION_ROLES:
            raise TaskError(
                f"other_implementation must be one of {', '.join(OTHER_IMPLEMENTATION_ROLES)}"
                f" (the aggregator another DAP implementation runs), got {other!r}"
            )
        if self.version not in {v.value for v in DapVersion}:
            known = ", ".join(v.value for v in DapVersion)
            raise TaskError(f"unknown DAP version {self.version!r}; expected one of {known}")
        for name in ("leader_endpoint", "helper_endpoint"):
            url = getattr(self, name)
            if not url or not all(0x21 <= ord(c) <= 0x7E for c in url) or len(url) > 0xFFFF:
                raise TaskError(f"{name} must be a URL of printable ASCII, got {url!r}")
        info = self.task_info.encode()
        if len(info) > 0xFF:
            raise TaskError(f"task_info is {len(info)} bytes in UTF-8; DAP allows at most 255")
        if not info and self.dap_version is DapVersion.DAP_18:
            raise TaskError("dap-18 needs a task_info of at least one byte")
        if self.task_interval is not None:
            start, end = self.task_interval
            if not 0 <= start < end < 2**63:
                raise TaskError(
                    f"task_interval_start must be before task_interval_end, both seconds"
                    f" since the epoch; got [{start}, {end})"
                )

    @property
    def dap_version(self) -> DapVersion:
        return DapVersion(self.version)

    @property
    def leader_selected(self) -> bool:
        """Whether the leader chooses each batch (DAP's leader-selected mode)."""
        return self.batch_mode == LEADER_SELECTED

    @property
    def noise_added_by(self) -> tuple[str, ...]:
        """The aggregator roles that add DP noise: veil's, never the other implementation's."""
        return tuple(r for r in OTHER_IMPLEMENTATION_ROLES if r != self.other_implementation)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "version": self.version,
            "leader_endpoint": self.leader_endpoint,
            "helper_endpoint": self.helper_endpoint,
        }
        if self.task_info:
            d["task_info"] = self.task_info
        if self.other_implementation is not None:
            d["other_implementation"] = self.other_implementation
        if self.batch_mode != TIME_INTERVAL:
            d["batch_mode"] = self.batch_mode
        if self.task_interval is not None:
            d["task_interval_start"], d["task_interval_end"] = self.task_interval
        return d

    @staticmethod
    def from_table(t: Table) -> DapSpec:
        start = t.optional_integer("task_interval_start", minimum=0)
        end = t.optional_integer("task_interval_end", minimum=0)
        if (start is None) != (end is None):
            raise t.error(None, "give task_interval_start and task_interval_end together")
        try:
            return DapSpec(
                leader_endpoint=t.text("leader_endpoint"),
                helper_endpoint=t.text("helper_endpoint"),
                version=t.text("version", DapVersion.DAP_19.value),
                task_info=t.text("task_info", ""),
                other_implementation=t.optional_text("other_implementation"),
                batch_mode=t.text("batch_mode", TIME_INTERVAL),
                task_interval=None if start is None or end is None else (start, end),
            )
        except TaskError as e:
            raise t.error(None, str(e)) from None


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

    def text_plan(self, vdaf: VdafSpec) -> HeavyHittersPlan:
        """A Poplar1 task's budget over its levels (`veil.dp.heavy_hitters`): the
        task's ε (or ρ) is the whole question's, spent evenly over its bits/8
        levels, one collection each."""
        try:
            return HeavyHittersPlan(
                self.config(),
                max_bytes=vdaf.max_bytes,
                neighbouring=self.neighbouring,  # type: ignore[arg-type]
                max_prefixes=MAX_QUERY_PREFIXES,
            )
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e

    def plan(self, vdaf: VdafSpec) -> NoisePlan:
        """The noise of one collection: for Poplar1, of one level's prefix counts."""
        if vdaf.is_prefix:
            return self.text_plan(vdaf).level_plan
        params = vdaf.dp_params
        try:
            return NoisePlan.for_task(
                self.config(), vdaf.kind.prio3, params, neighbouring=self.neighbouring
            )
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e

    def bounds(self, vdaf: VdafSpec) -> AggregateBounds:
        """Where this task's noised aggregates lie, and its largest batch (veil.dp.bounds)."""
        if vdaf.is_prefix:
            # A prefix count grows by at most 1 per report; the inner levels'
            # Field64 is the smaller field.
            inner = vdaf.instantiate_poplar1().idpf.field_inner.MODULUS
            return AggregateBounds(1, noise_bound(self.plan(vdaf)), inner)
        params = vdaf.dp_params
        try:
            report_max = feasible_range(vdaf.kind.prio3, params, 1)[1]
            noise = noise_bound(self.plan(vdaf))
        except DPError as e:
            raise TaskError(f"bad [dp] table for this VDAF: {e}") from e
        return AggregateBounds(max(report_max, 1), noise, vdaf.instantiate().field.MODULUS)

    def local(self, vdaf: VdafSpec) -> LocalChannel | None:
        """The randomized response every client applies (None: no local layer)."""
        if vdaf.is_prefix and self.local_epsilon is not None:
            raise TaskError("bad [dp] table: a poplar1 task takes no local_epsilon")
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
        fields: tuple[tuple[str, str], ...] = (
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
        if plan.sensitivity.total is not None:
            # The bound on the coordinates' changes together (an L1 ball).
            fields += (("total", str(plan.sensitivity.total)),)
        if vdaf.is_prefix:
            # One level's share: which part of the question's budget it is.
            fields += (("levels", str(vdaf.max_bytes)),)
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
        if self.budget is not None:
            return Fraction(self.budget)
        # A Poplar1 task's default total is every level once.
        return charge * vdaf.max_bytes if vdaf.is_prefix else charge

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

"""veil.dp: differential privacy for veil's aggregates.

Exact noise, chosen per task, added in the field by each aggregator, accounted in a
durable ledger, and turned into estimates with confidence intervals for the collector.

- Samplers are exact: integer and Fraction arithmetic only, after Canonne, Kamath,
  Steinke 2020, "The Discrete Gaussian for Differential Privacy" (CKS20). Textbook
  floating-point Laplace noise leaks through its low-order bits (Mironov 2012, "On
  significance of the least significant bits for differential privacy"), so no
  sampler here touches a float.
- `DiscreteLaplace` (two-sided geometric; the `geometric` and `laplace` mechanisms,
  pure ε-DP), `DiscreteGaussian` (the `gaussian` mechanism, ρ-zCDP), and
  `PolyaDifference`, one aggregator's share of a discrete Laplace in `split` mode.
- `DPConfig`, `sensitivity` and `NoisePlan` fix what noise each aggregator adds;
  `add_noise` adds it to an aggregate share mod p, and `decode` undoes the wrap.
- `BudgetLedger` refuses any collection that would overspend a task's or survey's ε.
- `estimate` gives unbiased estimates with confidence intervals from the exact pmf.
- `local` (veil.dp.local): randomized response on the respondent's device, for
  privacy against everyone including both aggregators, and its de-biased estimates.
- `heavy_hitters` (veil.dp.heavy_hitters): a text question (Poplar1, one query per
  byte): its budget over the levels, release threshold, detection floor, estimates.

Randomness: `secrets.SystemRandom()` unless an rng is injected (tests only).
"""

from veil.dp._exact import RandomSource
from veil.dp.budget import (
    Batch,
    BudgetLedger,
    BudgetStatus,
    BudgetUnit,
    LedgerStore,
    LedgerTransaction,
    Spend,
    SurveyBudget,
    TaskBudget,
)
from veil.dp.distributions import DiscreteGaussian, DiscreteLaplace, Polya, PolyaDifference
from veil.dp.errors import (
    BudgetExceeded,
    DPError,
    InvalidParameter,
    InvalidSensitivity,
    UnknownTask,
)
from veil.dp.estimates import (
    Estimate,
    clamp,
    consistent_bounded_sum,
    consistent_box,
    consistent_histogram,
    estimate,
    feasible_range,
    frequencies,
    mean,
    noise_half_width,
    project_histogram,
)
from veil.dp.local import LocalChannel, local_channel, local_error, local_estimate
from veil.dp.mechanisms import (
    DPConfig,
    Mechanism,
    NoiseMode,
    NoisePlan,
    Sensitivity,
    TotalNoise,
    add_noise,
    apply_noise,
    centred_lift,
    decode,
    draw_noise,
    encode_fixed_point,
    fixed_point_bound,
    sensitivity,
)

__all__ = [
    "Batch",
    "BudgetExceeded",
    "BudgetLedger",
    "BudgetStatus",
    "BudgetUnit",
    "DPConfig",
    "DPError",
    "DiscreteGaussian",
    "DiscreteLaplace",
    "Estimate",
    "InvalidParameter",
    "InvalidSensitivity",
    "LedgerStore",
    "LedgerTransaction",
    "LocalChannel",
    "Mechanism",
    "NoiseMode",
    "NoisePlan",
    "Polya",
    "PolyaDifference",
    "RandomSource",
    "Sensitivity",
    "Spend",
    "SurveyBudget",
    "TaskBudget",
    "TotalNoise",
    "UnknownTask",
    "add_noise",
    "apply_noise",
    "centred_lift",
    "clamp",
    "consistent_bounded_sum",
    "consistent_box",
    "consistent_histogram",
    "decode",
    "draw_noise",
    "encode_fixed_point",
    "estimate",
    "feasible_range",
    "fixed_point_bound",
    "frequencies",
    "local_channel",
    "local_error",
    "local_estimate",
    "mean",
    "noise_half_width",
    "project_histogram",
    "sensitivity",
]

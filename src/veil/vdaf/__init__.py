"""The VDAFs of draft-irtf-cfrg-vdaf (drafts 18 to 20): fields, XOFs, the
BBCGGI19 FLP with its gadgets and circuits, Prio3, and Poplar1 with the
BBCGGI21 IDPF. Pure: no I/O, no clocks, no global state; all randomness is
an argument."""

from veil.vdaf.errors import (
    AggParamError,
    AggParamSequenceError,
    CodecError,
    TooManyPrefixes,
    VdafError,
    VerifyError,
)
from veil.vdaf.spec.field import Field, Field64, Field128, Field255
from veil.vdaf.spec.poplar1 import Poplar1, Poplar1AggParam, Prefix
from veil.vdaf.spec.prio3 import (
    HelperInputShare,
    LeaderInputShare,
    Prio3,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    Prio3SumVecWithMultiproof,
    VerifierShare,
    VerifyState,
)
from veil.vdaf.spec.xof import XofFixedKeyAes128, XofTurboShake128

__all__ = [
    "AggParamError",
    "AggParamSequenceError",
    "CodecError",
    "Field",
    "Field64",
    "Field128",
    "Field255",
    "HelperInputShare",
    "LeaderInputShare",
    "Poplar1",
    "Poplar1AggParam",
    "Prefix",
    "Prio3",
    "Prio3Count",
    "Prio3Histogram",
    "Prio3L1BoundSum",
    "Prio3MultihotCountVec",
    "Prio3Sum",
    "Prio3SumVec",
    "Prio3SumVecWithMultiproof",
    "TooManyPrefixes",
    "VdafError",
    "VerifierShare",
    "VerifyError",
    "VerifyState",
    "XofFixedKeyAes128",
    "XofTurboShake128",
]

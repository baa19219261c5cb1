"""The Prio3 core of draft-irtf-cfrg-vdaf (drafts 18 to 20): fields, XOFs,
the BBCGGI19 FLP with its gadgets and circuits, and Prio3 itself. Pure: no
I/O, no clocks, no global state; all randomness is an argument."""

from veil.vdaf.errors import CodecError, VdafError, VerifyError
from veil.vdaf.spec.field import Field, Field64, Field128
from veil.vdaf.spec.prio3 import (
    HelperInputShare,
    LeaderInputShare,
    Prio3,
    Prio3Count,
    Prio3Histogram,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    Prio3SumVecWithMultiproof,
    VerifierShare,
    VerifyState,
)
from veil.vdaf.spec.xof import XofFixedKeyAes128, XofTurboShake128

__all__ = [
    "CodecError",
    "Field",
    "Field64",
    "Field128",
    "HelperInputShare",
    "LeaderInputShare",
    "Prio3",
    "Prio3Count",
    "Prio3Histogram",
    "Prio3MultihotCountVec",
    "Prio3Sum",
    "Prio3SumVec",
    "Prio3SumVecWithMultiproof",
    "VdafError",
    "VerifierShare",
    "VerifyError",
    "VerifyState",
    "XofFixedKeyAes128",
    "XofTurboShake128",
]

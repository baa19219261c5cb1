"""Known-answer tests against the official draft-irtf-cfrg-vdaf vectors.

Each Prio3 and Poplar1 file lists the operations to run in order and
whether each succeeds; every intermediate message is compared byte for
byte. The IDPF file checks key generation and evaluation alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.vectors import make_vdaf, vector_files
from veil.vdaf import (
    Field128,
    VerifyError,
    XofFixedKeyAes128,
    XofTurboShake128,
)
from veil.vdaf.spec.idpf import IdpfBBCGGI21
from veil.vdaf.spec.poplar1 import FieldVec, Poplar1, Poplar1VerifyState
from veil.vdaf.spec.prio3 import VerifierShare, VerifyState


@pytest.mark.parametrize("name", vector_files("Prio3"))
def test_prio3_vector(vdaf_vectors: Path, name: str) -> None:
    tv = json.loads((vdaf_vectors / name).read_text())
    vdaf = make_vdaf(name.removesuffix(".json"), tv)
    ctx = bytes.fromhex(tv["ctx"])
    verify_key = bytes.fromhex(tv["verify_key"])
    reports = tv["reports"]
    states: dict[tuple[int, int], VerifyState] = {}
    out_shares: dict[tuple[int, int], list[int]] = {}
    messages: dict[int, bytes | None] = {}
    agg_shares: dict[int, list[int]] = {}

    def run(op: dict[str, Any]) -> None:
        kind = op["operation"]
        index = op.get("report_index", 0)
        report = reports[index] if reports else {}
        agg_id = op.get("aggregator_id", 0)
        nonce = bytes.fromhex(report.get("nonce", ""))
        if kind == "shard":
            public_share, input_shares = vdaf.shard(
                ctx, report["measurement"], nonce, bytes.fromhex(report["rand"])
            )
            assert vdaf.encode_public_share(public_share).hex() == report["public_share"]
            assert [vdaf.encode_input_share(s).hex() for s in input_shares] == report[
                "input_shares"
            ]
        elif kind == "verify_init":
            public_share = vdaf.decode_public_share(bytes.fromhex(report["public_share"]))
            input_share = vdaf.decode_input_share(
                agg_id, bytes.fromhex(report["input_shares"][agg_id])
            )
            state, share = vdaf.verify_init(
                verify_key, ctx, agg_id, None, nonce, public_share, input_share
            )
            states[index, agg_id] = state
            expected = report["verifier_shares"][0]
            if agg_id < len(expected):
                assert vdaf.encode_verifier_share(share).hex() == expected[agg_id]
        elif kind == "verifier_shares_to_message":
            shares: list[VerifierShare] = [
                vdaf.decode_verifier_share(states[index, j], bytes.fromhex(h))
                for j, h in enumerate(report["verifier_shares"][0])
            ]
            message = vdaf.verifier_shares_to_message(ctx, None, shares)
            messages[index] = message
            assert vdaf.encode_verifier_message(message).hex() == report["verifier_messages"][0]
        elif kind == "verify_next":
            message = vdaf.decode_verifier_message(
                states[index, agg_id], bytes.fromhex(report["verifier_messages"][0])
            )
            out = vdaf.verify_next(ctx, states[index, agg_id], message)
            out_shares[index, agg_id] = out
            assert vdaf.encode_out_share(out).hex() == report["out_shares"][agg_id]
        elif kind == "aggregate":
            share = vdaf.agg_init(None)
            for i in range(len(reports)):
                share = vdaf.agg_update(None, share, out_shares[i, agg_id])
            agg_shares[agg_id] = share
            assert vdaf.encode_agg_share(share).hex() == tv["agg_shares"][agg_id]
        elif kind == "unshard":
            decoded = [vdaf.decode_agg_share(None, bytes.fromhex(h)) for h in tv["agg_shares"]]
            assert vdaf.unshard(None, decoded, len(reports)) == tv["agg_result"]
        else:
            raise AssertionError(f"unknown operation {kind}")

    failures = 0
    for op in tv["operations"]:
        if op["success"]:
            run(op)
        else:
            failures += 1
            with pytest.raises(VerifyError):
                run(op)
    assert failures == sum(1 for op in tv["operations"] if not op["success"])
    if "_bad_" in name:
        assert failures == 1, "a negative vector must exercise its failing operation"


@pytest.mark.parametrize("xof", [XofTurboShake128, XofFixedKeyAes128])
def test_xof_vector(vdaf_vectors: Path, xof: type[XofTurboShake128]) -> None:
    tv = json.loads((vdaf_vectors / f"{xof.__name__}.json").read_text())
    seed, dst, binder = (bytes.fromhex(tv[k]) for k in ("seed", "dst", "binder"))
    assert xof.derive_seed(seed, dst, binder).hex() == tv["derived_seed"]
    vec = xof.expand_into_vec(Field128, seed, dst, binder, tv["length"])
    assert Field128.encode_vec(vec).hex() == tv["expanded_vec_field128"]


# -- Poplar1 and its IDPF ------------------------------------------------


def test_poplar1_vectors_are_all_there(vdaf_vectors: Path) -> None:
    names = set(vector_files("Poplar1"))
    assert {f"Poplar1_{i}.json" for i in range(6)} | {"Poplar1_bad_corr_inner.json"} <= names
    assert (vdaf_vectors / "IdpfBBCGGI21_0.json").is_file()


@pytest.mark.parametrize("name", vector_files("Poplar1"))
def test_poplar1_vector(vdaf_vectors: Path, name: str) -> None:
    tv = json.loads((vdaf_vectors / name).read_text())
    vdaf = Poplar1(tv["bits"])
    ctx = bytes.fromhex(tv["ctx"])
    verify_key = bytes.fromhex(tv["verify_key"])
    agg_param = vdaf.decode_agg_param(bytes.fromhex(tv["agg_param"]))
    assert vdaf.encode_agg_param(agg_param).hex() == tv["agg_param"]
    reports = tv["reports"]
    states: dict[tuple[int, int], Poplar1VerifyState] = {}
    out_shares: dict[tuple[int, int], FieldVec] = {}

    def run(op: dict[str, Any]) -> None:
        kind = op["operation"]
        index = op.get("report_index", 0)
        report = reports[index] if reports else {}
        agg_id = op.get("aggregator_id", 0)
        nonce = bytes.fromhex(report.get("nonce", ""))
        if kind == "shard":
            public_share, input_shares = vdaf.shard(
                ctx, tuple(report["measurement"]), nonce, bytes.fromhex(report["rand"])
            )
            assert vdaf.encode_public_share(public_share).hex() == report["public_share"]
            assert [vdaf.encode_input_share(s).hex() for s in input_shares] == report[
                "input_shares"
            ]
        elif kind == "verify_init":
            public_share = vdaf.decode_public_share(bytes.fromhex(report["public_share"]))
            input_share = vdaf.decode_input_share(
                agg_id, bytes.fromhex(report["input_shares"][agg_id])
            )
            assert vdaf.encode_input_share(input_share).hex() == report["input_shares"][agg_id]
            state, share = vdaf.verify_init(
                verify_key, ctx, agg_id, agg_param, nonce, public_share, input_share
            )
            states[index, agg_id] = state
            assert vdaf.encode_verifier_share(share).hex() == report["verifier_shares"][0][agg_id]
        elif kind == "verifier_shares_to_message":
            rnd = op["round"]
            shares = [
                vdaf.decode_verifier_share(states[index, j], bytes.fromhex(h))
                for j, h in enumerate(report["verifier_shares"][rnd])
            ]
            message = vdaf.verifier_shares_to_message(ctx, agg_param, shares)
            assert vdaf.encode_verifier_message(message).hex() == report["verifier_messages"][rnd]
        elif kind == "verify_next":
            rnd = op["round"]
            state = states[index, agg_id]
            message = vdaf.decode_verifier_message(
                state, bytes.fromhex(report["verifier_messages"][rnd - 1])
            )
            result = vdaf.verify_next(ctx, state, message)
            if rnd < vdaf.ROUNDS:
                assert isinstance(result, tuple)
                states[index, agg_id], share = result
                assert (
                    vdaf.encode_verifier_share(share).hex()
                    == (report["verifier_shares"][rnd][agg_id])
                )
            else:
                assert isinstance(result, FieldVec)
                out_shares[index, agg_id] = result
                assert vdaf.encode_out_share(result).hex() == report["out_shares"][agg_id]
        elif kind == "aggregate":
            share = vdaf.agg_init(agg_param)
            for i in range(len(reports)):
                share = vdaf.agg_update(agg_param, share, out_shares[i, agg_id])
            assert vdaf.encode_agg_share(share).hex() == tv["agg_shares"][agg_id]
        elif kind == "unshard":
            decoded = [vdaf.decode_agg_share(agg_param, bytes.fromhex(h)) for h in tv["agg_shares"]]
            assert vdaf.unshard(agg_param, decoded, len(reports)) == tv["agg_result"]
        else:
            raise AssertionError(f"unknown operation {kind}")

    failures = 0
    for op in tv["operations"]:
        if op["success"]:
            run(op)
        else:
            failures += 1
            with pytest.raises(VerifyError):
                run(op)
    assert failures == sum(1 for op in tv["operations"] if not op["success"])
    if "_bad_" in name:
        assert failures == 1, "a negative vector must exercise its failing operation"


def test_idpf_vector(vdaf_vectors: Path) -> None:
    tv = json.loads((vdaf_vectors / "IdpfBBCGGI21_0.json").read_text())
    idpf = IdpfBBCGGI21(2, tv["bits"])
    ctx, nonce = bytes.fromhex(tv["ctx"]), bytes.fromhex(tv["nonce"])
    alpha = tuple(tv["alpha"])
    beta_inner = [[int(x) for x in value] for value in tv["beta_inner"]]
    beta_leaf = [int(x) for x in tv["beta_leaf"]]
    # The vector's keys are the two halves of the generator's randomness.
    rand = b"".join(bytes.fromhex(k) for k in tv["keys"])
    public_share, keys = idpf.gen(alpha, beta_inner, beta_leaf, ctx, nonce, rand)
    assert idpf.encode_public_share(public_share).hex() == tv["public_share"]
    assert [k.hex() for k in keys] == tv["keys"]
    decoded = idpf.decode_public_share(bytes.fromhex(tv["public_share"]))
    assert decoded == public_share
    # Evaluated on the path and beside it, the shares add up to beta and 0.
    for level in range(idpf.BITS):
        on_path = alpha[: level + 1]
        off_path = (*alpha[:level], not alpha[level])
        prefixes = sorted([on_path, off_path])
        shares = [idpf.eval(j, decoded, keys[j], level, prefixes, ctx, nonce) for j in (0, 1)]
        field = idpf.current_field(level)
        sums = [field.vec_add(a, b) for a, b in zip(*shares, strict=True)]
        beta = beta_inner[level] if level < idpf.BITS - 1 else beta_leaf
        assert sums[prefixes.index(on_path)] == beta
        assert sums[prefixes.index(off_path)] == [0, 0]

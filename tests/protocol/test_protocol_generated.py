"""The committed generated code matches what protoc makes of protos/."""

from __future__ import annotations

from veil.protocol.generate import check, proto_files


def test_protos_exist() -> None:
    names = {p.name for p in proto_files()}
    assert {"messages.proto", "leader.proto", "helper.proto"} <= names


def test_generated_code_is_current() -> None:
    stale = check()
    assert not stale, f"regenerate with `python scripts/gen_protos.py`: {stale}"

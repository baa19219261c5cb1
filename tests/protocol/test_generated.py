"""The committed generated code matches what protoc makes of protos/."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from veil.protocol.generate import PROTO_DIR, check, proto_files


def test_protos_exist() -> None:
    names = {p.name for p in proto_files()}
    assert {"messages.proto", "leader.proto", "helper.proto"} <= names


def test_generated_code_is_current() -> None:
    stale = check()
    assert not stale, f"regenerate with `python scripts/gen_protos.py`: {stale}"


def test_every_message_field_and_enum_value_is_commented(tmp_path: Path) -> None:
    """Stubs generated for other languages carry these comments: each message,
    field, enum, enum value, service and method says what it is."""
    from grpc_tools import protoc

    out = tmp_path / "descriptors.pb"
    args = ["protoc", f"-I{PROTO_DIR}", "--include_source_info", f"--descriptor_set_out={out}"]
    assert protoc.main([*args, *(str(p) for p in proto_files())]) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    missing = []
    for f in files:
        commented = {
            tuple(loc.path) for loc in f.source_code_info.location if loc.leading_comments.strip()
        }
        # Paths use the field numbers of FileDescriptorProto and its parts
        # (descriptor.proto): 4 message_type, 2 field, 4 enum_type, 2 value,
        # 5 enum_type of the file, 6 service, 2 method.
        wanted: list[tuple[tuple[int, ...], str]] = []
        for i, m in enumerate(f.message_type):
            wanted.append(((4, i), m.name))
            wanted += [((4, i, 2, j), f"{m.name}.{x.name}") for j, x in enumerate(m.field)]
            for j, e in enumerate(m.enum_type):
                wanted.append(((4, i, 4, j), f"{m.name}.{e.name}"))
                wanted += [
                    ((4, i, 4, j, 2, k), f"{m.name}.{e.name}.{v.name}")
                    for k, v in enumerate(e.value)
                ]
        for i, e in enumerate(f.enum_type):
            wanted.append(((5, i), e.name))
            wanted += [((5, i, 2, k), f"{e.name}.{v.name}") for k, v in enumerate(e.value)]
        for i, svc in enumerate(f.service):
            wanted += [((6, i, 2, j), f"{svc.name}.{x.name}") for j, x in enumerate(svc.method)]
        missing += [f"{f.name}: {name}" for path, name in wanted if path not in commented]
    assert missing == []

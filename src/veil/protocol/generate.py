"""Generation of the protocol code from protos/ (used by scripts/gen_protos.py and tests).

Needs grpcio-tools (the `test` extra); nothing at run time imports this module.
"""

from __future__ import annotations

import filecmp
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "protos"
PACKAGE = Path("veil") / "protocol" / "v1"


def proto_files() -> list[Path]:
    """The .proto sources, sorted, relative to PROTO_DIR."""
    return sorted(p.relative_to(PROTO_DIR) for p in (PROTO_DIR / PACKAGE).glob("*.proto"))


def generate(out: Path) -> None:
    """Run protoc on every proto file, writing under `out`/veil/protocol/v1."""
    from grpc_tools import protoc

    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
    init = out / PACKAGE / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated from protos/veil/protocol/v1 by scripts/gen_protos.py."""\n')
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + " ".join(args[1:]))


def check() -> list[str]:
    """Names of generated files that differ from a fresh generation (empty if current)."""
    committed = ROOT / "src" / PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / PACKAGE
        names = sorted({p.name for p in fresh.iterdir()} | {p.name for p in committed.iterdir()})
        return [
            n
            for n in names
            if n != "__pycache__"
            and not (
                (committed / n).is_file()
                and (fresh / n).is_file()
                and filecmp.cmp(committed / n, fresh / n, shallow=False)
            )
        ]

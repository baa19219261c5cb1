"""Regenerate the gRPC/protobuf code in src/veil/protocol/ from protos/.

The .proto files live under protos/veil/protocol/v1/ with package
veil.protocol.v1, mirroring the Python package path, so that

    python -m grpc_tools.protoc -Iprotos --python_out=src --pyi_out=src \
        --grpc_python_out=src protos/veil/protocol/v1/*.proto

writes src/veil/protocol/v1/*_pb2.py(i) and *_pb2_grpc.py whose imports
(`from veil.protocol.v1 import messages_pb2`) work unedited. The output is
committed; tests/protocol/test_generated.py fails when it no longer matches.

Usage: python scripts/gen_protos.py [--check] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veil.protocol.generate import ROOT, check, generate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    if args.check:
        stale = check()
        for name in stale:
            print(f"stale or missing: {name}", file=sys.stderr)
        return 1 if stale else 0
    generate(ROOT / "src")
    print(f"generated into {Path('src/veil/protocol/v1')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

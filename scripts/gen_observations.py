"""Write the generated part of docs/OBSERVATIONS.md from src/veil/data/observations.toml.

Usage: python scripts/gen_observations.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from veil.observations import load_inventory, replace_generated

DOC = Path(__file__).resolve().parents[1] / "docs" / "OBSERVATIONS.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the document is stale")
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = replace_generated(text, load_inventory())
    if args.check:
        if new != text:
            print(f"{DOC} is stale: run python scripts/gen_observations.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

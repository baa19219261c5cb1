"""Build the API reference (HTML, pdoc) from veil's docstrings into docs/api/.

    python scripts/gen_api_docs.py            # then open docs/api/index.html
    python scripts/gen_api_docs.py --out /tmp/veil-api

Exits 1 if pdoc warned (CI builds it the same way, in tests/tools/test_apidocs.py).
The logic lives in ``tools.apidocs``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The tooling (tools/) lives beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.apidocs import build


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/api"))
    args = parser.parse_args()
    try:
        problems = build(args.out)
    except ModuleNotFoundError as e:
        if e.name != "pdoc":
            raise
        # The quick start installs veil without its test extra, which brings pdoc.
        print(
            "gen_api_docs: pdoc is not installed; install the test extra: pip install -e '.[test]'",
            file=sys.stderr,
        )
        return 2
    for p in problems:
        print(p, file=sys.stderr)
    print(f"API reference in {args.out / 'index.html'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

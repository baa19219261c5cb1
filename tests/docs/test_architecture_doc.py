"""docs/ARCHITECTURE.md names every package and top-level module of veil, so
that a new one cannot arrive without a word on where it belongs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "veil"


def test_every_package_and_module_is_named() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    store = sorted(p.name for p in (PACKAGE / "aggregator" / "store").glob("[!_]*.py"))
    assert len(packages) > 5 and len(modules) > 10 and "ledger.py" in store
    missing = [f"veil.{p}" for p in packages if f"`veil.{p}`" not in doc]
    missing += [m for m in modules + store if f"`{m}`" not in doc]
    assert missing == [], f"docs/ARCHITECTURE.md does not say where these live: {missing}"

"""What a fresh process imports for the `veil` command before it runs one:
the parser of every command is built from light modules (each command
imports what it runs when it runs), and a server leaves out what only some
configurations use. The test suite starts hundreds of these processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


# Each is a tenth of a CPU-second or more of a start, or pulls in such a one.
HEAVY = ("numpy", "grpc", "cryptography", "Crypto", "veil.task", "veil.client", "veil.vdaf")


def among(modules: set[str], names: tuple[str, ...]) -> set[str]:
    """The modules that are one of `names` or inside one of them."""
    return {m for m in modules if any(m == n or m.startswith(n + ".") for n in names)}


def imported_by_main(argv: list[str]) -> set[str]:
    """The modules `veil ARGV` holds when it exits (--help and --version exit)."""
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print(json.dumps(sorted(sys.modules))))\n"
        "from veil.cli import main\n"
        f"main({argv!r})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["survey", "respond", "--help"], ["--version"]])
def test_the_parser_and_help_import_no_command(argv: list[str]) -> None:
    modules = imported_by_main(argv)
    assert among(modules, HEAVY) == set()
    assert ("importlib.metadata" in modules) == (argv == ["--version"])


def test_a_command_chosen_imports_what_its_options_need() -> None:
    # `task new` lists the VDAF registry's kinds in its help.
    modules = imported_by_main(["task", "new", "--help"])
    assert "veil.vdaf.registry" in modules
    assert among(modules, ("grpc", "veil.client")) == set()


def test_a_server_leaves_out_what_only_some_configurations_use() -> None:
    modules = imported_after("import veil.cli.server, veil.aggregator.run.server")
    # Starlette serves only a [dap] listen; pycryptodome's RSA signs only
    # where OpenSSL's libcrypto cannot be loaded (an aggregator only verifies).
    assert among(modules, ("starlette", "Crypto.PublicKey")) == set()
    assert "veil.aggregator.core" in modules  # the import did happen

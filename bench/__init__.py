"""Measurements of veil, outside the runtime package: what the scripts under
scripts/ run and print as tables (throughput of the VDAF, of the client and of
a local deployment, the survey page's guard, the timing side channel of the
noise, the coverage of published intervals at small surveys).

Importable from the repository's root (the scripts put it on sys.path; the
tests run from there); a server install (`pip install veil`) does not ship it.
"""

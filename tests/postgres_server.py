"""The suite's throwaway PostgreSQL (veil.aggregator.throwaway_pg), re-exported for tests."""

from veil.aggregator.throwaway_pg import DSN_ENV, as_url, find_pg_bin, postgres_dsn, with_schema

__all__ = ["DSN_ENV", "as_url", "find_pg_bin", "postgres_dsn", "with_schema"]

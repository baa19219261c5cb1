"""What the tests (and the benchmark scripts) need that is not veil itself:
the throwaway PostgreSQL server and the storage backends the suite runs on."""

"""veil.local: veil on one machine, for trying it and for tests: the launcher
that starts a leader and a helper as local processes on loopback, and the
demo that runs a survey end to end through them (`veil demo`, `veil simulate`)."""

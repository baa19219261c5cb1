"""Storage written once: units of work over a small transaction interface.

`tx` is what a unit sees of one open transaction on either backend (SQLite or
PostgreSQL): statements written once with `?` placeholders, and the few
places where the two dialects differ (row locks, id lists, table locks).
The units of work themselves are in `reports` (reports, aggregates,
counts), `jobs` (aggregation jobs), `collection_jobs` and `prefix_queries`
(Poplar1's queries); `upkeep` holds those of keys and garbage collection,
`ledger` the budget ledger's; a backend only opens the
transaction, retries it where its database asks, and hands it to a unit.
`base` is the `Datastore` class the backends subclass, `records` the row
types and conflicts, `migrations` the one numbered list of schema migrations
both backends apply (and their one schema-version table).
"""

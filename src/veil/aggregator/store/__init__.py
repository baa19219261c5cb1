"""Storage written once: units of work over a small transaction interface.

`tx` is what a unit sees of one open transaction on either backend (SQLite or
PostgreSQL): statements written once with `?` placeholders, and the few
places where the two dialects differ (row locks, id lists). `units` holds the
units of work themselves; a backend only opens the transaction, retries it
where its database asks, and hands it to a unit. `records` holds the row
types and conflicts, `migrations` the one numbered list of schema
migrations both backends apply (and their one schema-version table).
"""

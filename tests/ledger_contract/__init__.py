"""The ledger contract: what every ledger backend must do, run against each one in `BACKENDS`.

Transitions and conflicts, races between connections, expiry, recovery, redaction at rest, the change feed,
instance leases, the pending limit, pins and tokens, observed only through the seams the pipeline uses. What
only SQLite has (WAL, pragmas, migrations, triggers, checkpoints, files on disk) is tested in
tests/test_ledger_sqlite.py.
"""

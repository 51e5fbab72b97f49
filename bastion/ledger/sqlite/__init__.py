"""The SQLite ledger: `SqliteLedger` (`ledger`), its tables and migrations (`schema`), and the statements on each
table (`invocations`, `pins`, `tokens`)."""

from bastion.ledger.sqlite.ledger import SqliteLedger

__all__ = ["SqliteLedger"]

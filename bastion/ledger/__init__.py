"""The invocation store (DESIGN.md §6): redaction and truncation, and the SQLite implementation of `Ledger`.

`schema` holds the tables and their migrations, `invocations`, `pins` and `tokens` the statements on them, and
`sqlite` the `SqliteLedger` that runs them on one connection.
"""

from bastion.ledger.redaction import Redactor
from bastion.ledger.sqlite import SqliteLedger

__all__ = ["Redactor", "SqliteLedger"]

"""The invocation store (DESIGN.md §6): redaction and truncation, and the SQLite implementation of `Ledger`."""

from bastion.ledger.redaction import Redactor
from bastion.ledger.sqlite import SqliteLedger

__all__ = ["Redactor", "SqliteLedger"]

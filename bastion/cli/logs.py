"""Logging for the `bastion` command: `BASTION_LOG_LEVEL` sets the level of Bastion's own loggers only,
every other library logs at WARNING and above, and every line is redacted before it is written.

Third-party loggers are the ones that would print call data wholesale at DEBUG (the SSE response writer logs
each chunk it sends), so they never go below WARNING whatever the variable says; and since an argument or
result can still reach a log line (a message, an exception, a traceback), the handler redacts what it writes
with the same `Redactor` the ledger uses.
"""

from __future__ import annotations

import copy
import logging
import sys
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from bastion.ledger.redaction import Redactor

LOG_LEVEL_ENV_VAR: Final = "BASTION_LOG_LEVEL"
DEFAULT_LEVEL: Final = logging.WARNING
THIRD_PARTY_LEVEL: Final = logging.WARNING
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVEL_NAMES: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
BASTION_LOGGER: Final = "bastion"


class RedactingFormatter(logging.Formatter):
    """Formats a record, then redacts the whole text: message, arguments and traceback alike.

    Dict and list arguments are redacted as structures first, so a secret under a secret key goes even when
    its value is not a string (`{'credentials': {...}}`); the finished line then goes through text redaction.
    """

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__(LOG_FORMAT)
        self._redactor = redactor

    @property
    def redactor(self) -> Redactor:
        """The redactor given (`use_redactor`), else one of the default secret keys, made at the first line logged:
        the ledger package it comes from is not imported by commands that log nothing (`bastion --help`)."""
        if self._redactor is None:
            from bastion.ledger.redaction import Redactor

            self._redactor = Redactor()
        return self._redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        self._redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, dict | list) or record.args:
            record = copy.copy(record)  # other handlers must still see the record as it was logged
            record.msg = self._redact_structure(record.msg)
            if isinstance(record.args, dict):  # `log("%s", mapping)` and `log("%(key)s", mapping)` alike
                record.args = self.redactor.redact(record.args)
            elif record.args:
                record.args = tuple(self._redact_structure(arg) for arg in record.args)
        return self.redactor.redact_text(super().format(record))

    def _redact_structure(self, value: Any) -> Any:
        if isinstance(value, dict | list):
            return self.redactor.redact(value)
        if isinstance(value, tuple):
            return tuple(self.redactor.redact(value))
        return value  # everything else is redacted as part of the finished line


class ThirdPartyAtWarning(logging.Filter):
    """Lets Bastion's own records through at any level, other libraries' only from WARNING up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= THIRD_PARTY_LEVEL or _is_bastions(record.name)


def _is_bastions(name: str) -> bool:
    return name == BASTION_LOGGER or name.startswith(BASTION_LOGGER + ".")


_formatter: Final = RedactingFormatter()


def parse_level(value: str | None) -> int:
    """The logging level named by `$BASTION_LOG_LEVEL` (any case; unset or empty: WARNING).

    Raises ValueError, naming the variable and the accepted names, for anything else.
    """
    if value is None or not value.strip():
        return DEFAULT_LEVEL
    name = value.strip().upper()
    if name not in LEVEL_NAMES:
        raise ValueError(f"{LOG_LEVEL_ENV_VAR}={value!r} is not a log level; use one of {', '.join(LEVEL_NAMES)}")
    return logging.getLevelNamesMapping()[name]


def log_handler(stream: TextIO) -> logging.Handler:
    """The handler `configure_logging` installs: other libraries from WARNING up, every line redacted."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_formatter)
    handler.addFilter(ThirdPartyAtWarning())
    return handler


def configure_logging(level: int) -> None:
    """Log to stderr: Bastion's loggers at `level`, everything else at WARNING, every line redacted."""
    root = logging.getLogger()
    root.setLevel(THIRD_PARTY_LEVEL)
    root.addHandler(log_handler(sys.stderr))
    logging.getLogger(BASTION_LOGGER).setLevel(level)


def use_redactor(redactor: Redactor) -> None:
    """Redact log lines with the configured redactor (its extra secret keys) from now on."""
    _formatter.redactor = redactor

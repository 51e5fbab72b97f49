"""Checking JSON against a tool's JSON Schema (its input schema for arguments, its output schema for results).

Every call checks its arguments, and every forwarded result with an output schema is checked too, so the check is
on the hot path. `jsonschema-rs` (compiled, in Rust) says whether an instance is valid; the Python `jsonschema`
package, the one the MCP SDK checks with, says why not and has the last word: an instance is refused only when
`jsonschema` finds an error in it, so messages and verdicts on refusals are the SDK's. The draft comes from the
schema's `$schema`, 2020-12 when it names none, in both. Neither fetches anything: a schema whose `$ref` leaves the
document is checked by `jsonschema` alone, which refuses to resolve it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match


class SchemaCheck:
    """One schema, compiled once for each library."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        cls = validators.validator_for(schema, default=Draft202012Validator)
        self._reference = cls(schema)
        try:
            self._fast: Any = jsonschema_rs.validator_for(dict(schema), retriever=_no_retrieval)
        except (jsonschema_rs.ValidationError, ValueError, TypeError):  # e.g. a remote $ref: `jsonschema` decides
            self._fast = None

    def error(self, instance: Any) -> ValidationError | None:
        """The error `jsonschema` reports for `instance` (its best match), or None when it is valid. Raises what
        `jsonschema` raises for a schema it cannot use (an unresolvable `$ref`)."""
        if self._fast is not None and self._valid_fast(instance):
            return None
        found: ValidationError | None = best_match(self._reference.iter_errors(instance))
        return found

    def _valid_fast(self, instance: Any) -> bool:
        try:
            return bool(self._fast.is_valid(instance))
        except (ValueError, TypeError, OverflowError):  # a value Rust cannot hold (an integer beyond 64 bits)
            return False


def _no_retrieval(uri: str) -> Any:
    raise ValueError(f"{uri} is not fetched: a tool's schema is checked as it is")

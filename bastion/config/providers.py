"""`[providers.<id>]` and `[sources.<id>]` in bastion.toml: each table checked alone (a provider's credential is
optional to load; a package kind's settings are its own to check).

A broken table is reported with its line and left out; the rest of the file still applies. A table whose
`token` is missing, empty, or an `${env:NAME}` that is not set still loads: the provider is then `unbound`
(it runs as `unavailable`, its calls `binding_required`) and `bastion doctor` reports where to bind it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from bastion.config.models import PROVIDER_KINDS, ConfigIssue, ExternalSource, ProviderConfig
from bastion.config.tomlpos import KeyIndex, KeyPath, describe_error

ReportFn = Callable[[Path, int, str], None]
ClaimFn = Callable[[str, int], str | None]
"""Claims a source id for the source defined at a line: None when it was free, else where it is claimed."""
"""Records one problem of a file: (file, line, message)."""

_SOURCE_ID: Final = re.compile(r"^[a-z0-9_-]+$")
_PROVIDERS_TABLE: Final = (
    'providers are tables: write [providers.github] with token = "${env:GITHUB_TOKEN}" under it '
    "(this entry is ignored until then)"
)


def is_credential(path: KeyPath) -> bool:
    """`providers.<id>.token`: a value whose absence unbinds one provider instead of spoiling bastion.toml."""
    return len(path) == 3 and path[0] == "providers" and path[2] == "token"


def load_providers(
    tables: Any,
    file: Path,
    index: KeyIndex,
    *,
    unset_credentials: Mapping[KeyPath, str],
    claim: ClaimFn,
    report: ReportFn,
) -> tuple[dict[str, ProviderConfig], dict[str, ConfigIssue]]:
    """The usable providers of bastion.toml's `providers` value, and why each unbound one is unbound.

    `unset_credentials` are the `token` keys whose `${env:NAME}` is not set (with the NAME), left out of
    `tables`; a provider id already claimed (`claim`: by a connector, or reserved) is refused, naming where."""
    if tables is None:
        return {}, {}
    if not isinstance(tables, dict):
        report(file, index.line_of(("providers",)), _PROVIDERS_TABLE)
        return {}, {}
    loaded: dict[str, ProviderConfig] = {}
    unbound: dict[str, ConfigIssue] = {}
    for provider_id, table in tables.items():
        line = index.line_of(("providers", provider_id))
        if not _SOURCE_ID.match(provider_id):
            report(
                file,
                line,
                f'provider id "{provider_id}" may use only lowercase letters, digits, "_" and "-"; rename '
                f"[providers.{provider_id}] (set kind = ... when the id is not the API's name)",
            )
        elif not isinstance(table, dict):
            report(file, line, _PROVIDERS_TABLE)
        elif (first := claim(provider_id, line)) is not None:
            report(
                file,
                line,
                f'source id "{provider_id}" is already claimed by {first}; rename [providers.{provider_id}] and set '
                'kind = "..." in it (the provider is ignored until then)',
            )
        elif (provider := _provider(provider_id, table, file, index, report)) is not None:
            loaded[provider_id] = provider
            why = _unbound(provider_id, provider, unset_credentials)
            if why is not None:
                unbound[provider_id] = ConfigIssue(
                    file=file,
                    line=index.line_of(("providers", provider_id, "token")),
                    message=f"provider {provider_id}: binding_required: {why} (its actions are unavailable until "
                    "then; docs/configuration.md says which scopes the token needs)",
                )
    return loaded, unbound


def _provider(
    provider_id: str, table: dict[str, Any], file: Path, index: KeyIndex, report: ReportFn
) -> ProviderConfig | None:
    """One table checked (its keys, its kind, Sentry's organization), or None when it was reported."""
    where: KeyPath = ("providers", provider_id)
    outcome = f"provider {provider_id} is not enabled"
    try:
        provider = ProviderConfig.model_validate(table)
    except ValidationError as exc:
        for error in exc.errors():
            loc: KeyPath = (*where, *error["loc"])
            message = describe_error({**error, "loc": loc}, list(ProviderConfig.model_fields))
            report(file, index.line_of(loc), f"{message} ({outcome} until then)")
        return None
    kind = provider.effective_kind(provider_id)
    if kind is None:
        kinds = ", ".join(f'"{k}"' for k in PROVIDER_KINDS)
        report(file, index.line_of(where), f"[providers.{provider_id}] needs kind = one of {kinds} ({outcome})")
        return None
    if kind == "sentry" and provider.organization is None:
        report(
            file,
            index.line_of(where),
            f'[providers.{provider_id}] (sentry) needs organization = "your-org-slug" ({outcome} until then)',
        )
        return None
    return provider


def _unbound(provider_id: str, provider: ProviderConfig, unset_credentials: Mapping[KeyPath, str]) -> str | None:
    """Why the provider's credential is not bound, and how to bind it; None when it is."""
    unset = unset_credentials.get(("providers", provider_id, "token"))
    if unset is not None:
        return f"environment variable {unset} is not set; export it"
    if provider.token is None or not provider.token.get_secret_value().strip():
        variable = f"{provider_id.upper().replace('-', '_')}_TOKEN"
        return f'it has no token; add token = "${{env:{variable}}}" and export {variable}'
    return None


_SOURCES_TABLE: Final = (
    "[sources.<id>] names a source of a kind an installed package offers: kind = \"<the entry point's name in the "
    "group bastion.sources>\", then the kind's own settings"
)


def load_source_tables(
    tables: Any, file: Path, index: KeyIndex, *, claim: ClaimFn, report: ReportFn
) -> dict[str, ExternalSource]:
    """Every usable `[sources.<id>]` of bastion.toml's `sources` value: a kind and its settings (checked by the kind
    itself when it loads, see `bastion.sources.registry`). An id already claimed is refused, naming where."""
    if tables is None:
        return {}
    if not isinstance(tables, dict):
        report(file, index.line_of(("sources",)), _SOURCES_TABLE)
        return {}
    loaded: dict[str, ExternalSource] = {}
    for source_id, table in tables.items():
        line = index.line_of(("sources", source_id))
        kind = table.get("kind") if isinstance(table, dict) else None
        if not _SOURCE_ID.match(source_id):
            report(
                file,
                line,
                f'source id "{source_id}" may use only lowercase letters, digits, "_" and "-"; rename '
                f"[sources.{source_id}]",
            )
        elif not isinstance(kind, str) or not kind:
            report(file, line, f"[sources.{source_id}] needs a kind: {_SOURCES_TABLE}")
        elif (first := claim(source_id, line)) is not None:
            report(
                file,
                line,
                f'source id "{source_id}" is already claimed by {first}; rename [sources.{source_id}] (this source is '
                "ignored until then)",
            )
        else:
            settings = {key: value for key, value in table.items() if key != "kind"}
            loaded[source_id] = ExternalSource(kind=kind, settings=settings, file=file, line=line)
    return loaded

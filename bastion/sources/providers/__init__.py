"""Provider actions: Bastion's own adapters to HTTP APIs, one module per API.

`base` holds what they share (the action declaration and the `ProviderSource` that serves a provider's
actions), `api` one call's HTTP requests and the translation of their failures, `evidence` what proves that an
object a look-up found was made by the call; `github`, `linear`, `sentry` and `slack` declare their actions.
`provider_source` builds the source for one `[providers.<id>]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import httpx2

from bastion.config import ProviderConfig, ProviderKind
from bastion.sources.providers import github, linear, sentry, slack
from bastion.sources.providers.base import ProviderAction, ProviderDefinition, ProviderSource

DEFINITIONS: Final[dict[ProviderKind, Callable[[ProviderConfig], ProviderDefinition]]] = {
    "github": github.definition,
    "linear": linear.definition,
    "sentry": sentry.definition,
    "slack": slack.definition,
}


def provider_source(
    provider_id: str,
    config: ProviderConfig,
    *,
    unbound: str | None = None,
    call_timeout: float = 30.0,
    marker_key: bytes | None = None,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> ProviderSource:
    """The source of one configured provider (its kind checked by the loader); see `ProviderSource`."""
    kind = config.effective_kind(provider_id)
    if kind is None:
        raise ValueError(f"provider {provider_id!r} has no kind")  # the loader never lets one through
    definition = DEFINITIONS[kind](config)
    return ProviderSource(
        provider_id,
        config,
        definition,
        unbound=unbound,
        call_timeout=call_timeout,
        marker_key=marker_key,
        transport=transport,
    )


__all__ = ["DEFINITIONS", "ProviderAction", "ProviderDefinition", "ProviderSource", "provider_source"]

"""What every provider makes of an API that fails: the same translation for each (`connectors/providers/api.py`).

Nothing sent: `connector_unavailable`. A 429 (or GitHub's spent rate limit): `rate_limited` with the wait. Any
other 4xx, a 5xx: `upstream_error`. A timeout or a dropped connection, or a 2xx that cannot be read: for a write,
`unknown_outcome` (it may have acted); for a read, `upstream_error` (nothing changed). And the credential never
comes back out, even from an API that echoes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from bastion.errors import (
    BastionError,
    BindingRequired,
    ConnectorUnavailable,
    RateLimited,
    UnknownOutcome,
    UpstreamError,
)
from tests.providers import CANARY, Answer, ScriptedApi, call, dumped, never, ok, running, source

pytestmark = pytest.mark.anyio

SETTINGS: dict[str, dict[str, Any]] = {"sentry": {"organization": "acme"}}
CALLS: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "github": {
        "read": ("list_issues", {"owner": "acme", "repo": "app"}),
        "write": ("create_issue", {"owner": "acme", "repo": "app", "title": "t"}),
    },
    "linear": {"read": ("list_issues", {}), "write": ("update_issue", {"issue": "ENG-1", "title": "t"})},
    "sentry": {"read": ("list_issues", {}), "write": ("resolve_issue", {"issue_id": "1"})},
    "slack": {"read": ("list_channels", {}), "write": ("post_message", {"channel": "C1", "text": "hi"})},
}


def _raising(exc: Callable[[httpx2.Request], Exception]) -> Answer:
    async def answer(request: httpx2.Request) -> httpx2.Response:
        raise exc(request)

    return answer


FAILURES: dict[str, tuple[Answer, type[Exception], type[Exception]]] = {
    # name: (answer, error for a read, error for a write)
    "401": (ok({"message": "Bad credentials"}, 401), UpstreamError, UpstreamError),
    "404": (ok({"message": "Not Found"}, 404), UpstreamError, UpstreamError),
    "422": (ok({"message": "Validation Failed", "errors": [{"code": "invalid"}]}, 422), UpstreamError, UpstreamError),
    "429": (ok({"message": "slow down"}, 429, headers={"retry-after": "30"}), RateLimited, RateLimited),
    "500": (ok({"detail": "Internal Error"}, 500), UpstreamError, UpstreamError),
    "503 text": (httpx2.Response(503, text="<html>down</html>"), UpstreamError, UpstreamError),
    "not json": (httpx2.Response(200, text="<html>hello</html>"), UpstreamError, UnknownOutcome),
    "connect error": (
        _raising(lambda r: httpx2.ConnectError("refused", request=r)),
        ConnectorUnavailable,
        ConnectorUnavailable,
    ),
    "connect timeout": (
        _raising(lambda r: httpx2.ConnectTimeout("slow", request=r)),
        ConnectorUnavailable,
        ConnectorUnavailable,
    ),
    "read timeout": (_raising(lambda r: httpx2.ReadTimeout("timed out", request=r)), UpstreamError, UnknownOutcome),
    "dropped": (
        _raising(lambda r: httpx2.RemoteProtocolError("peer closed", request=r)),
        UpstreamError,
        UnknownOutcome,
    ),
    "no answer in time": (never, UpstreamError, UnknownOutcome),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("kind", ["read", "write"])
@pytest.mark.parametrize("provider", sorted(CALLS))
async def test_every_provider_maps_each_failure_to_its_error_class(provider: str, kind: str, failure: str) -> None:
    answer, read_error, write_error = FAILURES[failure]
    api = ScriptedApi([answer])
    action, arguments = CALLS[provider][kind]
    async with running(source(provider, api, **SETTINGS.get(provider, {}))) as running_provider:
        with pytest.raises(BastionError) as raised:
            await call(running_provider, action, arguments, timeout=0.5)
    assert type(raised.value) is (read_error if kind == "read" else write_error)
    if isinstance(raised.value, RateLimited):
        assert raised.value.retry_after == 30
    assert len(api.requests) == 1, "a failure is never retried behind the caller's back"


async def test_github_s_spent_rate_limit_is_rate_limited_until_its_reset() -> None:
    reset = int(time.time()) + 120
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    api = ScriptedApi([ok({"message": "API rate limit exceeded"}, 403, headers=headers)])
    async with running(source("github", api)) as github:
        with pytest.raises(RateLimited) as raised:
            await call(github, *CALLS["github"]["read"])
    assert raised.value.retry_after is not None and 60 < raised.value.retry_after <= 120


async def test_a_retry_after_date_is_a_wait_in_seconds() -> None:
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 90))
    api = ScriptedApi([ok({}, 429, headers={"retry-after": later})])
    async with running(source("slack", api)) as slack:
        with pytest.raises(RateLimited) as raised:
            await call(slack, *CALLS["slack"]["read"])
    assert raised.value.retry_after is not None and 30 < raised.value.retry_after <= 90


async def test_a_403_without_a_spent_limit_is_a_missing_permission_not_a_rate_limit() -> None:
    api = ScriptedApi([ok({"message": "Resource not accessible by integration"}, 403)])
    async with running(source("github", api)) as github:
        with pytest.raises(UpstreamError):
            await call(github, *CALLS["github"]["write"])


@pytest.mark.parametrize("provider", sorted(CALLS))
async def test_a_provider_without_its_token_is_unavailable_and_refuses_calls_without_sending_anything(
    provider: str,
) -> None:
    api = ScriptedApi([ok({})])
    async with running(source(provider, api, token=None, **SETTINGS.get(provider, {}))) as unbound:
        assert unbound.status.state == "unavailable"
        assert "binding_required" in (unbound.status.last_error or "")
        assert unbound.actions() == []
        with pytest.raises(BindingRequired) as raised:
            await call(unbound, *CALLS[provider]["read"])
    assert not raised.value.retriable
    assert api.requests == []


async def test_an_api_that_echoes_the_token_never_hands_it_back() -> None:
    echoed = {"message": f"token {CANARY} is not allowed here"}
    issue = {
        "number": 1,
        "title": f"Bearer {CANARY}",
        "state": "open",
        "html_url": "https://github.com/acme/app/issues/1",
        "created_at": "x",
        "updated_at": "y",
        CANARY: CANARY,
    }
    api = ScriptedApi([ok([issue]), ok(echoed, 403), ok(echoed, 500)])
    async with running(source("github", api)) as github:
        listed = await call(github, *CALLS["github"]["read"])
        errors = []
        for _ in range(2):
            with pytest.raises(UpstreamError) as raised:
                await call(github, *CALLS["github"]["write"])
            errors.append(raised.value)
        status = github.status
    assert api.requests[0].headers["authorization"] == f"Bearer {CANARY}", "the token did go to the API"
    assert listed.structured_content is not None and "[REDACTED]" in listed.structured_content["issues"][0]["title"]
    assert CANARY not in dumped(listed, status) + " ".join(str(e) + e.message for e in errors)


async def test_a_redirect_to_another_host_is_followed_without_the_token() -> None:
    moved = httpx2.Response(302, headers={"location": "https://elsewhere.example/repos/acme/app/issues"})
    api = ScriptedApi([moved, ok([])])
    async with running(source("github", api)) as github:
        result = await call(github, *CALLS["github"]["read"])
    assert not result.is_error
    first, second = api.requests
    assert first.headers["authorization"] == f"Bearer {CANARY}"
    assert second.url.host == "elsewhere.example" and "authorization" not in second.headers

"""The approver commands against a remote Bastion, through its REST API.

`--url URL --token T` (or `$BASTION_URL`, `$BASTION_TOKEN`) switch `bastion approvals|grants ...` from the
local ledger to this client. The API answers with the same JSON shapes the local commands print, and
its error bodies carry the same error classes, which become the same exit statuses. A token without a URL
is for the local ledger: once it has owner or admin tokens, local decisions need one
(`bastion.cli.compose.local_approver`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
import httpx2

from bastion.cli.app import TOKEN_ENV_VAR, URL_ENV_VAR
from bastion.errors import ConfigError
from bastion.server.errors import from_http

logger = logging.getLogger(__name__)

RECONNECT_SECONDS: Final = 2.0
"""The pause before the event stream reconnects after it dropped."""
_STREAM_TIMEOUT: Final = httpx2.Timeout(30.0, read=None)


class RemoteApi:
    """A small client of `/api`: every answer is JSON; every refusal is raised as its BastionError."""

    def __init__(self, url: str, token: str) -> None:
        self.base = url.rstrip("/")
        self._client = httpx2.AsyncClient(
            base_url=f"{self.base}/api",
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30.0),
        )

    async def __aenter__(self) -> RemoteApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def pending(self, limit: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await self._request("GET", "/approvals", params={"limit": limit}))["approvals"]
        return found

    async def invocation(self, invocation_id: str) -> dict[str, Any]:
        return await self._request("GET", f"/invocations/{invocation_id}")

    async def decide(
        self, invocation_id: str, *, approve: bool, note: str | None, scope: str = "once", when: str | None = None
    ) -> dict[str, Any]:
        if not approve:
            return await self._request("POST", f"/approvals/{invocation_id}/deny", json={"reason": note})
        body = {"note": note, "scope": scope, "when": when}
        return await self._request("POST", f"/approvals/{invocation_id}/approve", json=body)

    async def grants(self, *, ended: bool, limit: int) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"ended": "true" if ended else "false", "limit": limit}
        return list((await self._request("GET", "/grants", params=params))["grants"])

    async def revoke_grant(self, grant_id: str) -> dict[str, Any]:
        return await self._request("POST", f"/grants/{grant_id}/revoke")

    async def events(self, after: int | None = None) -> AsyncIterator[str]:
        """The names of the remote's events after event id `after` (None: from now on) as they happen
        (`GET /api/events`), resuming after the last one seen when the connection drops. Ends at once when the
        remote has no event stream (an older Bastion)."""
        last = None if after is None else str(after)
        while True:
            headers = {"Last-Event-ID": last} if last is not None else {}
            try:
                async with self._client.stream("GET", "/events", headers=headers, timeout=_STREAM_TIMEOUT) as response:
                    if response.status_code == 404:
                        return
                    if response.status_code != 200:
                        await response.aread()
                        raise from_http(response.status_code, response.json()) or ConfigError(
                            f"{self.base}/api/events answered {response.status_code}"
                        )
                    async for line in response.aiter_lines():
                        if line.startswith("id:"):
                            last = line[3:].strip()
                        elif line.startswith("event:"):
                            yield line[6:].strip()
            except httpx2.HTTPError as exc:
                logger.debug("the event stream of %s dropped (%s); reconnecting", self.base, exc)
            await anyio.sleep(RECONNECT_SECONDS)

    async def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self._client.request(method, path, **kwargs)
        except httpx2.HTTPError as exc:
            raise ConfigError(f"cannot reach {self.base}: {exc}; check --url (or ${URL_ENV_VAR})") from exc
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if response.is_success and isinstance(body, dict):
            return body
        refusal = from_http(response.status_code, body)
        if refusal is None:
            raise ConfigError(
                f"{self.base} answered {response.status_code} without a Bastion error body; is it a Bastion API?"
            )
        raise refusal


def remote_api(url: str | None, token: str | None) -> RemoteApi | None:
    """The remote client when a URL is given (flag or environment), else None for the local ledger (where a
    token, if given, names the approver)."""
    url = url or os.environ.get(URL_ENV_VAR) or None
    token = token or os.environ.get(TOKEN_ENV_VAR) or None
    if url is None:
        return None
    if token is None:
        raise ConfigError(
            f"--url needs --token (or ${TOKEN_ENV_VAR}); create one on that Bastion with "
            "`bastion tokens create NAME --role admin`"
        )
    return RemoteApi(url, token)

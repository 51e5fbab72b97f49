"""One provider call's view of its HTTP API: requests, pages, and the translation of what goes wrong.

Every foreign failure becomes a Bastion error here, by whether the request could have changed anything:

- nothing was sent (the connection could not be made): `ConnectorUnavailable`, retriable;
- 429, or GitHub's 403 with its rate limit spent: `RateLimited`, with the wait (`Retry-After` or the reset time);
- any other 4xx or a 5xx answer: `UpstreamError`, naming the status and the API's own message;
- a timeout or a dropped connection once a *mutating* request was sent: `UnknownOutcome` (it may have acted);
  the same after a request that changes nothing (a read) is an `UpstreamError`: a retry is safe.

A mutating request carries the call's correlation id as its `Idempotency-Key` header; what a call makes carries
its keyed `tag` (see `evidence.py`).
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import httpx2
from pydantic import BaseModel, ValidationError

from bastion import tracing
from bastion.errors import BastionError, ConnectorUnavailable, RateLimited, UnknownOutcome, UpstreamError
from bastion.sources.providers.evidence import tag_of, verifies

IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
MAX_PAGES: Final = 10
"""A list follows at most this many pages, whatever its `limit` (each page holds up to 100 items)."""
MESSAGE_CHARS: Final = 300
"""How much of an API's error message is quoted in a Bastion error."""

_NOT_SENT: Final = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout, httpx2.UnsupportedProtocol)
_LINK: Final = re.compile(r"<([^>]*)>((?:\s*;\s*[^;,]+)*)")
_M = TypeVar("_M", bound=BaseModel)

Json = Any
"""A decoded JSON value."""


class Rehearsed(Exception):
    """A rehearsal reached the first request that would change something: built exactly as the call would send it,
    and not sent (`Api(rehearsal=True)`, a provider's preview)."""

    def __init__(self, request: httpx2.Request) -> None:
        super().__init__(f"{request.method} {request.url}")
        self.request = request


class Api:
    """One call of one provider action: its requests share the call's correlation id, and know whether one that
    could change something has gone out (then a lost answer means an unknown outcome).

    A `rehearsal` (a preview) sends the requests that change nothing, as the call would, and stops at the first
    that would change something: it raises Rehearsed with that request, unsent."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        *,
        name: str,
        correlation_id: str,
        marker_key: bytes | None = None,
        rehearsal: bool = False,
    ) -> None:
        self.rehearsal = rehearsal
        self.client = client
        self.name = name
        """How errors name the provider and action, e.g. `github:create_issue`."""
        self.correlation_id = correlation_id
        self._marker_key = marker_key
        self.mutated = False
        """Whether a mutating request may have reached the API during this call."""

    @property
    def marker_key(self) -> bytes:
        """The key of the call's marks; ConnectorUnavailable, before anything is sent, when the source was built
        without one."""
        if self._marker_key is None:
            raise without_marker_key(self.name)
        return self._marker_key

    @property
    def tag(self) -> str:
        """The call's keyed tag (`evidence.tag_of`): what it makes carries it, and nobody without the key can
        write it."""
        return tag_of(self.marker_key, self.correlation_id)

    def verifies(self, tag: str | None) -> bool:
        """Whether `tag`, read from something found, is this call's own."""
        return verifies(self.marker_key, self.correlation_id, tag)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Json = None,
        mutating: bool | None = None,
        check: bool = True,
    ) -> httpx2.Response:
        """Send one request and return its 2xx answer; raise the Bastion error for anything else.

        `mutating` defaults to whether the method is not GET or HEAD (a GraphQL query is a POST that changes
        nothing: pass False). With `check` False any answer is returned, for the caller to read first (GraphQL
        errors), then to `check_status`."""
        changes = method not in ("GET", "HEAD") if mutating is None else mutating
        headers = {IDEMPOTENCY_HEADER: self.correlation_id} if changes else None
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:  # no params rather than empty ones: those would drop the query of a next-page URL
            request = self.client.build_request(method, path, params=query or None, json=body, headers=headers)
        except httpx2.HTTPError as exc:
            raise ConnectorUnavailable(f"{self.name}: the request cannot be made ({exc}); check base_url") from exc
        if self.rehearsal and changes:
            raise Rehearsed(request)
        before = self.mutated
        self.mutated = before or changes  # from here on the request may leave, even if the call is cancelled
        attributes = {"http.request.method": method, "server.address": request.url.host}
        with tracing.span(f"HTTP {method}", kind=tracing.SpanKind.CLIENT, attributes=attributes) as span:
            request.headers.update(tracing.inject_headers({}))  # W3C trace context: the API may continue the trace
            try:
                response = await self.client.send(request)
            except _NOT_SENT as exc:
                self.mutated = before  # it never left
                if before:  # but an earlier request of the call may have acted
                    raise self.lost(exc) from exc
                raise ConnectorUnavailable(
                    f"{self.name}: cannot reach {request.url.host} ({type(exc).__name__}); nothing was sent, "
                    "retry later"
                ) from exc
            except httpx2.HTTPError as exc:
                raise self.lost(exc) from exc
            span.set_attribute("http.response.status_code", response.status_code)
            if check:
                check_status(response, self.name, mutating=changes)
        return response

    def lost(self, exc: BaseException) -> BastionError:
        """The error for an answer that never came (a timeout, a dropped connection) once a request was sent."""
        what = "timed out" if isinstance(exc, (httpx2.TimeoutException, TimeoutError)) else "lost its connection"
        if self.mutated:
            return UnknownOutcome(
                f"{self.name} {what} once a request that changes things was sent ({type(exc).__name__}); it may "
                "have acted: check "
                f"the API (look for idempotency key {self.correlation_id}) before retrying"
            )
        return UpstreamError(f"{self.name} {what} ({type(exc).__name__}); it changed nothing, a retry is safe")

    async def json(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Json = None,
        mutating: bool | None = None,
    ) -> Json:
        """`request`, and its answer decoded as JSON."""
        response = await self.request(method, path, params=params, body=body, mutating=mutating)
        return self.decode(response)

    def decode(self, response: httpx2.Response) -> Json:
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self.unreadable("its answer is not JSON") from exc

    def parse(self, model: type[_M], data: Json) -> _M:
        """An API answer read into one of our models; an answer of another shape is the API's fault."""
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"]) or "(root)"
            raise self.unreadable(f"its answer has an unexpected shape at {where}: {problem['msg']}") from exc

    def _same_origin(self, url: str) -> None:
        """Refuse a URL the API gave (a next page) that is not on the configured API's origin."""
        base = self.client.base_url
        try:
            target = base.join(url)
        except httpx2.InvalidURL as exc:
            raise self.unreadable(f"its next page link is not a URL ({exc})") from exc
        if _origin(target) != _origin(base):
            raise UpstreamError(
                f"{self.name}: the API's next page is on another origin ({target.scheme}://{target.host}), which "
                f"would receive the token; not followed. If {base.scheme}://{base.host} is right, the API (or a "
                "proxy in front of it) must link its pages there"
            )

    def unreadable(self, why: str) -> BastionError:
        """A 2xx answer that cannot be read: after a mutation it did act, but what it did is not known."""
        if self.mutated:
            return UnknownOutcome(f"{self.name} was accepted, but {why}; check the API before retrying")
        return UpstreamError(f"{self.name}: {why}")

    async def pages(
        self,
        path: str,
        *,
        params: Mapping[str, Any],
        limit: int,
        items_key: str | None = None,
        keep: Callable[[Json], bool] | None = None,
    ) -> tuple[list[Json], bool]:
        """Follow `Link: <...>; rel="next"` pages (GitHub, Sentry) until `limit` items or MAX_PAGES pages.

        Returns the items kept (at most `limit`) and whether more were left behind. `items_key` names the list
        in an object answer (None: the answer is the list); `keep` drops items (GitHub lists pull requests
        among issues). A next page on another origin than the configured API's is refused, never requested: the
        request would carry the provider's token there (as a redirect would, were redirects followed)."""
        items: list[Json] = []
        url: str | None = path
        query: Mapping[str, Any] | None = params
        for _ in range(MAX_PAGES):
            assert url is not None
            response = await self.request("GET", url, params=query)
            data = self.decode(response)
            page = data.get(items_key) if items_key is not None and isinstance(data, dict) else data
            if not isinstance(page, list):
                raise self.unreadable("its answer is not a list")
            items.extend(item for item in page if keep is None or keep(item))
            url, query = next_link(response), None  # the next link carries the whole query
            if len(items) >= limit or url is None:
                break
            self._same_origin(url)
        return items[:limit], len(items) > limit or url is not None


def without_marker_key(name: str) -> ConnectorUnavailable:
    """The error of a call that must mark what it makes, or look it up, on a source built without the marker key."""
    return ConnectorUnavailable(
        f"{name}: this provider was built without the ledger's marker key, so it can neither mark what it makes nor "
        "look it up; nothing was sent (a bug: Bastion's composition root gives every provider the key, see "
        "bastion/assembly.py)"
    )


def _origin(url: httpx2.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def check_status(response: httpx2.Response, name: str, *, mutating: bool) -> None:
    """Raise the Bastion error for an answer that is not 2xx (see the module docstring)."""
    status = response.status_code
    if 200 <= status < 300:
        return
    message = api_message(response)
    wait = retry_after(response)
    if status == 429 or (status == 403 and (wait is not None or _rate_limit_spent(response))):
        after = f"retry in {wait:.0f} s" if wait is not None else "retry later"
        raise RateLimited(f"{name}: the API's rate limit is reached ({status}: {message}); {after}", retry_after=wait)
    if status >= 500:
        hint = "; it may have acted: check before retrying" if mutating else "; retry later"
        raise UpstreamError(f"{name}: the API failed ({status}: {message}){hint}")
    hints = {
        401: "the token was refused: check it is valid and not expired",
        403: "the token lacks a permission or scope this action needs (docs/configuration.md lists the scopes)",
        404: "not found, or the token cannot see it",
    }
    hint = hints.get(status, "the API refused the request")
    raise UpstreamError(f"{name}: {hint} ({status}: {message})")


def api_message(response: httpx2.Response) -> str:
    """The API's own words for an error: `message`, `detail`, `error` or the first of `errors`, else its text."""
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    found: Any = None
    if isinstance(data, dict):
        found = data.get("message") or data.get("detail") or data.get("error")
        errors = data.get("errors")
        if found is None and isinstance(errors, list) and errors:
            first = errors[0]
            found = first.get("message") if isinstance(first, dict) else first
    text = str(found) if found is not None else response.text.strip() or response.reason_phrase
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def retry_after(response: httpx2.Response) -> float | None:
    """Seconds to wait from `Retry-After` (seconds or an HTTP date), else GitHub's `x-ratelimit-reset` once the
    limit is spent; None when the answer does not say."""
    header = response.headers.get("retry-after")
    if header is not None:
        text = header.strip()
        if text.isdigit():
            return float(text)
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    reset = response.headers.get("x-ratelimit-reset")
    if reset is not None and _rate_limit_spent(response) and reset.strip().isdigit():
        return max(0.0, float(reset) - time.time())
    return None


def _rate_limit_spent(response: httpx2.Response) -> bool:
    return response.headers.get("x-ratelimit-remaining", "").strip() == "0"


def next_link(response: httpx2.Response) -> str | None:
    """The `rel="next"` URL of a `Link` header; None when there is none or Sentry says `results="false"`."""
    for match in _LINK.finditer(response.headers.get("link", "")):
        attributes = dict(
            (key.strip().lower(), value.strip().strip('"'))
            for key, _, value in (part.partition("=") for part in match.group(2).split(";") if part.strip())
        )
        if attributes.get("rel") == "next" and attributes.get("results", "true") != "false":
            return match.group(1)
    return None

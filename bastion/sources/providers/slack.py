"""Slack's Web API (`https://slack.com/api/<method>`).

Risks: listing channels is `read`; posting a message is `write` (it can be edited or deleted, though people may
have read it). A posted message carries the invocation id and its keyed tag in its metadata (`event_type`
`bastion_invocation`, see `evidence.py`), so an `unknown` outcome can be settled by looking for it in the
channel's history (`bastion invocations reconcile ID --check`); the request also sends the id as
`Idempotency-Key`.

A look-up reads the channel's history (a reply: its thread's replies) since the call began, with message
metadata, and keeps the messages whose metadata names the invocation. One is accepted, and the call completed,
only when its tag verifies, it was posted by the token's own bot or user (`auth.test`), it is where the call
posted (a reply in the thread it named, or a message of the channel itself) and its `ts` is within the call's
window. Any other (metadata without the tag, which anyone who knows the invocation id can write; a copy posted by
another app or user, elsewhere or at another time) is answered not accepted, saying why, and the call stays
unknown. Not found leaves it unknown too: people can delete a message, a workspace's retention can drop it, and
the history read is bounded (MAX_PAGES pages), so Slack cannot say for certain that a call never posted. A
channel given by `#name` is first found by name among the channels the token can list.

Slack answers most errors with HTTP 200 and `{"ok": false, "error": "<code>"}`: those are `upstream_error`
(nothing was posted), `ratelimited` is `rate_limited`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import AliasPath, Field

from bastion.actions import Found
from bastion.config import ProviderConfig
from bastion.errors import RateLimited, UpstreamError
from bastion.sources.providers.api import Api, Json, retry_after
from bastion.sources.providers.base import Output, Params, ProviderAction, ProviderDefinition, arguments_for
from bastion.sources.providers.evidence import Candidate, Window, verdict

DEFAULT_BASE_URL: Final = "https://slack.com/api"
METADATA_EVENT: Final = "bastion_invocation"
PAGE_SIZE: Final = 200
MAX_PAGES: Final = 10

_HINTS: Final = {
    "not_authed": "no token was sent",
    "invalid_auth": "the token was refused: check it is valid",
    "token_revoked": "the token was revoked",
    "missing_scope": "the token lacks a scope this action needs (docs/configuration.md lists the scopes)",
    "channel_not_found": "no such channel visible to the token (use list_channels for ids)",
    "not_in_channel": "the app is not in that channel: invite it, or give it chat:write.public",
    "is_archived": "the channel is archived",
}


# -- results


class Channel(Output):
    id: str
    name: str
    is_private: bool = False
    is_archived: bool = False
    is_member: bool = False
    members: int | None = Field(default=None, validation_alias="num_members")
    topic: str | None = Field(default=None, validation_alias=AliasPath("topic", "value"))


class ChannelList(Output):
    channels: list[Channel]
    truncated: bool = Field(description="More channels exist than were returned: raise limit.")


class Posted(Output):
    channel: str
    ts: str = Field(description="The message's timestamp: its id within the channel (thread replies use it).")
    thread_ts: str | None = Field(default=None, validation_alias=AliasPath("message", "thread_ts"))


# -- params


ChannelType = Literal["public_channel", "private_channel"]


def _public() -> list[ChannelType]:
    return ["public_channel"]


class ListChannels(Params):
    types: list[ChannelType] = Field(default_factory=_public, min_length=1, description="Which kinds of channel.")
    include_archived: bool = False
    limit: int = Field(default=100, ge=1, le=1000, description="At most this many.")


class PostMessage(Params):
    channel: str = Field(min_length=1, description="A channel id (from list_channels), or a name like #general.")
    text: str = Field(min_length=1, max_length=40000, description="The message, in Slack's mrkdwn.")
    thread_ts: str | None = Field(default=None, description="Reply in the thread of this message (its ts).")


# -- execution


async def call(api: Api, method: str, *, params: dict[str, Any] | None = None, body: Json = None) -> dict[str, Any]:
    """One Web API method; its answer when `ok`, else the error it names."""
    response = await api.request("POST" if body is not None else "GET", f"/{method}", params=params, body=body)
    data = api.decode(response)
    if not isinstance(data, dict):
        raise api.unreadable("its answer is not an object")
    if data.get("ok") is True:
        return data
    code = str(data.get("error", "unknown_error"))
    if code == "ratelimited":
        wait = retry_after(response)
        after = f"retry in {wait:.0f} s" if wait is not None else "retry later"
        raise RateLimited(f"{api.name}: Slack's rate limit is reached; {after}", retry_after=wait)
    needed = f" (needs {data['needed']})" if isinstance(data.get("needed"), str) else ""
    hint = _HINTS.get(code, "Slack refused the request")
    raise UpstreamError(f"{api.name}: {hint}{needed} ({code})")


async def list_channels(api: Api, params: ListChannels) -> ChannelList:
    channels: list[Json] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        query = {
            "types": ",".join(params.types),
            "exclude_archived": "false" if params.include_archived else "true",
            "limit": min(PAGE_SIZE, params.limit),
            "cursor": cursor,
        }
        data = await call(api, "conversations.list", params=query)
        channels.extend(data.get("channels") or [])
        cursor = _next_cursor(data)
        if cursor is None or len(channels) >= params.limit:
            break
    truncated = len(channels) > params.limit or cursor is not None
    return api.parse(ChannelList, {"channels": channels[: params.limit], "truncated": truncated})


async def post_message(api: Api, params: PostMessage) -> Posted:
    body: dict[str, Any] = {
        "channel": params.channel,
        "text": params.text,
        "metadata": {
            "event_type": METADATA_EVENT,
            "event_payload": {"invocation_id": api.correlation_id, "tag": api.tag},
        },
    }
    if params.thread_ts is not None:
        body["thread_ts"] = params.thread_ts
    return api.parse(Posted, await call(api, "chat.postMessage", body=body))


class MessagePlace(Params):
    """Where a `post_message` call posted: what its look-up needs of the call's arguments."""

    channel: str = Field(min_length=1)
    thread_ts: str | None = None


def _next_cursor(data: dict[str, Any]) -> str | None:
    metadata = data.get("response_metadata")
    return (metadata.get("next_cursor") if isinstance(metadata, dict) else None) or None


async def _channel_id(api: Api, channel: str) -> str:
    """The id of a channel given by id or `#name` (the history methods take only ids)."""
    if not channel.startswith("#"):
        return channel
    name, cursor = channel.removeprefix("#"), None
    for _ in range(MAX_PAGES):
        query = {"types": "public_channel,private_channel", "limit": PAGE_SIZE, "cursor": cursor}
        data = await call(api, "conversations.list", params=query)
        for item in data.get("channels") or []:
            if isinstance(item, dict) and item.get("name") == name and isinstance(item.get("id"), str):
                return str(item["id"])
        cursor = _next_cursor(data)
        if cursor is None:
            break
    raise UpstreamError(f"{api.name}: no channel named {channel} is visible to the token; settle it by hand")


def _payload_for(message: Json, invocation_id: str) -> dict[str, Any] | None:
    """The metadata payload of a message that names the invocation; None for any other message."""
    metadata = message.get("metadata") if isinstance(message, dict) else None
    if not isinstance(metadata, dict) or metadata.get("event_type") != METADATA_EVENT:
        return None
    payload = metadata.get("event_payload")
    return payload if isinstance(payload, dict) and payload.get("invocation_id") == invocation_id else None


class _Identity(Output):
    """Who the token is (`auth.test`): a bot token's messages carry its `bot_id`, a user token's its user."""

    user_id: str
    user: str | None = None
    bot_id: str | None = None


def _posted_at(ts: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(ts), UTC)
    except (TypeError, ValueError, OverflowError):
        return None


def _refuted(
    api: Api, message: Json, payload: dict[str, Any], me: _Identity, place: MessagePlace, window: Window
) -> list[str]:
    """What refutes that the call posted `message`: its tag, its poster, its place (the thread), its time."""
    refuted = []
    tag = payload.get("tag")
    if not api.verifies(tag if isinstance(tag, str) else None):
        refuted.append(
            "its metadata's tag is missing or not keyed by this Bastion: anyone who knows the invocation id can write "
            "such metadata"
        )
    mine, theirs = (
        (f"bot {me.bot_id}", message.get("bot_id")) if me.bot_id else (f"user {me.user_id}", message.get("user"))
    )
    if theirs != (me.bot_id or me.user_id):
        who = message.get("bot_id") or message.get("user") or "someone unknown"
        refuted.append(f"it was posted by {who}, not by the token's {mine}")
    ts, thread = message.get("ts"), message.get("thread_ts")
    if place.thread_ts is None and thread not in (None, ts):
        refuted.append(f"it is a reply in thread {thread}, and the call posted to the channel itself")
    if place.thread_ts is not None and (thread != place.thread_ts or ts == place.thread_ts):
        refuted.append(f"it is not a reply in thread {place.thread_ts}, where the call posted")
    elsewhen = window.refutes(_posted_at(ts), f"ts {ts}")
    if elsewhen is not None:
        refuted.append(elsewhen)
    return refuted


async def find_message(api: Api, arguments: Mapping[str, Any], window: Window) -> Found | None:
    """The message a `post_message` call posted, by its metadata, in the channel's history (or the thread's
    replies) since the call began, judged as the module docstring says."""
    place = arguments_for(api, MessagePlace, arguments)
    channel = await _channel_id(api, place.channel)
    method = "conversations.history" if place.thread_ts is None else "conversations.replies"
    marked: list[tuple[Json, dict[str, Any]]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        query = {
            "channel": channel,
            "ts": place.thread_ts,
            "oldest": f"{window.start.timestamp():.6f}",
            "include_all_metadata": "true",
            "limit": PAGE_SIZE,
            "cursor": cursor,
        }
        data = await call(api, method, params=query)
        for message in data.get("messages") or []:
            payload = _payload_for(message, api.correlation_id)
            if payload is not None:
                marked.append((message, payload))
        cursor = _next_cursor(data)
        if cursor is None:
            break
    if not marked:
        return None
    me = api.parse(_Identity, await call(api, "auth.test"))
    candidates = []
    for message, payload in marked:
        posted = api.parse(Posted, {"channel": channel, "ts": message.get("ts"), "message": message})
        made = _posted_at(posted.ts)
        candidates.append(
            Candidate(
                f"message {posted.ts} in channel {channel}",
                posted.model_dump(),
                message.get("bot_id") or message.get("user"),
                made.strftime("%Y-%m-%dT%H:%M:%SZ") if made is not None else None,
                _refuted(api, message, payload, me, place, window),
            )
        )
    return verdict(candidates)


ACTIONS: Final[tuple[ProviderAction[Any], ...]] = (
    ProviderAction(
        "list_channels",
        "List Slack channels",
        "List the workspace's channels (public by default) with their id, name, topic and member count. Post "
        "with the id.",
        "read",
        ListChannels,
        ChannelList,
        list_channels,
    ),
    ProviderAction(
        "post_message",
        "Post a Slack message",
        "Post a message to a channel (by id or #name), or as a reply in a thread (thread_ts). Returns the message's "
        "ts. Needs approval by default.",
        "write",
        PostMessage,
        Posted,
        post_message,
        look_up=find_message,
    ),
)


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def definition(config: ProviderConfig) -> ProviderDefinition:
    return ProviderDefinition("slack", DEFAULT_BASE_URL, auth_headers, ACTIONS)

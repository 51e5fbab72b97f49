"""Slack provider actions: the exact Web API requests each one sends, and what `ok: false` becomes."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.errors import BastionError, RateLimited, UpstreamError
from bastion.sources.providers.evidence import tag_of
from bastion.sources.providers.slack import METADATA_EVENT
from tests.providers import CANARY, MARKER_KEY, ScriptedApi, body_of, call, looked_up, ok, query_of, running, source

pytestmark = pytest.mark.anyio


def channel(channel_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": channel_id,
        "name": f"chan-{channel_id}",
        "is_channel": True,
        "is_private": False,
        "is_archived": False,
        "is_member": True,
        "num_members": 4,
        "topic": {"value": "releases", "creator": "U1", "last_set": 0},
        "purpose": {"value": "", "creator": "", "last_set": 0},
        **extra,
    }


async def test_list_channels_follows_cursors_to_the_limit() -> None:
    api = ScriptedApi(
        [
            ok(
                {
                    "ok": True,
                    "channels": [channel("C1"), channel("C2")],
                    "response_metadata": {"next_cursor": "dGVhbTpD"},
                }
            ),
            ok({"ok": True, "channels": [channel("C3")], "response_metadata": {"next_cursor": ""}}),
        ]
    )
    async with running(source("slack", api)) as slack:
        result = await call(slack, "list_channels", {"types": ["public_channel", "private_channel"], "limit": 5})
    first, second = api.requests
    assert (first.method, str(first.url).split("?")[0]) == ("GET", "https://slack.com/api/conversations.list")
    assert query_of(first) == {"types": "public_channel,private_channel", "exclude_archived": "true", "limit": "5"}
    assert first.headers["authorization"] == f"Bearer {CANARY}"
    assert "idempotency-key" not in first.headers
    assert query_of(second)["cursor"] == "dGVhbTpD"
    assert result.structured_content is not None
    assert result.structured_content["truncated"] is False
    assert result.structured_content["channels"][0] == {
        "id": "C1",
        "name": "chan-C1",
        "is_private": False,
        "is_archived": False,
        "is_member": True,
        "members": 4,
        "topic": "releases",
    }


async def test_post_message_posts_json_with_the_invocation_in_its_metadata() -> None:
    api = ScriptedApi([ok({"ok": True, "channel": "C1", "ts": "1700000000.000100", "message": {"text": "hi"}})])
    async with running(source("slack", api)) as slack:
        result = await call(slack, "post_message", {"channel": "C1", "text": "Deployed v2", "thread_ts": "1699.1"})
    assert (api.last.method, str(api.last.url)) == ("POST", "https://slack.com/api/chat.postMessage")
    assert api.last.headers["idempotency-key"] == "inv-1"
    assert api.last.headers["content-type"].startswith("application/json")
    assert body_of(api.last) == {
        "channel": "C1",
        "text": "Deployed v2",
        "thread_ts": "1699.1",
        "metadata": {
            "event_type": METADATA_EVENT,
            "event_payload": {"invocation_id": "inv-1", "tag": tag_of(MARKER_KEY, "inv-1")},
        },
    }
    assert result.structured_content == {"channel": "C1", "ts": "1700000000.000100", "thread_ts": None}


async def test_a_look_up_reports_a_message_with_untagged_metadata_from_another_poster_without_accepting_it() -> None:
    metadata = {"event_type": METADATA_EVENT, "event_payload": {"invocation_id": "inv-1"}}
    message = {"ts": "4070908800.000100", "user": "U0AGENT", "text": "Deployed.", "metadata": metadata}
    me = {"ok": True, "user_id": "U0BASTION", "user": "bastion", "bot_id": "B0BASTION"}
    api = ScriptedApi([ok({"ok": True, "messages": [{"ts": "1.0", "text": "other"}, message]}), ok(me)])
    async with running(source("slack", api)) as slack:
        found = await looked_up(slack, "post_message", {"channel": "C1", "text": "Deployed."})
    history, identity = api.requests
    assert (history.url.path, query_of(history)["include_all_metadata"]) == ("/api/conversations.history", "true")
    assert identity.url.path == "/api/auth.test"
    assert found is not None and (found.outcome, found.accepted) == ("completed", False)
    assert found.reason is not None
    for why in ("tag is missing", "posted by U0AGENT, not by the token's bot B0BASTION", "outside the call's window"):
        assert why in found.reason
    assert (found.creator, found.result["ts"]) == ("U0AGENT", "4070908800.000100")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (ok({"ok": False, "error": "channel_not_found"}), UpstreamError),
        (ok({"ok": False, "error": "missing_scope", "needed": "chat:write"}), UpstreamError),
        (ok({"ok": False, "error": "ratelimited"}, 429, headers={"retry-after": "7"}), RateLimited),
    ],
)
async def test_slack_errors_become_bastion_errors(answer: Any, error: type[BastionError]) -> None:
    api = ScriptedApi([answer])
    async with running(source("slack", api)) as slack:
        with pytest.raises(error) as raised:
            await call(slack, "post_message", {"channel": "C1", "text": "hi"})
    if isinstance(raised.value, RateLimited):
        assert raised.value.retry_after == 7


async def test_each_action_declares_its_risk_and_whether_a_retry_is_safe() -> None:
    async with running(source("slack", ScriptedApi([ok({})]))) as slack:
        specs = slack.actions()
    assert {s.action_id: (s.risk, s.idempotency_key, s.reconcile) for s in specs} == {
        "list_channels": ("read", False, "manual"),
        "post_message": ("write", False, "lookup"),
    }

"""The approver API against its own OpenAPI document: schemathesis generates valid and invalid requests
from `/api/openapi.json` of a live server and checks every answer (no 5xx; status codes, content types,
headers and bodies as documented; invalid input refused; auth not ignored).

Bounded and deterministic: a fixed number of examples per route and mode, derandomized, no example
database. The server runs in a blocking portal's event loop; the requests are made from this thread.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import httpx2
import schemathesis
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.core.result import Ok

from bastion.models import Pin, utcnow
from tests.test_api import WAIT, Live, invocation, live_bastion, observation, seed

EXAMPLES = 50
"""Examples per route and generation mode: 7 routes x 2 modes x 50 = 700 requests, about ten seconds."""

ACCEPTED: Final = ["2xx", "401", "403", "404", "409", "410"]
CONFIG = schemathesis.Config.from_dict(
    {
        # A valid decision on an expired invocation is rightly refused with 410 (the default list lacks it).
        "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}},
        # An approval's scope must be one the call is offered (here, on the embedded default, never "always"), and
        # its `when` a CEL condition: what no JSON Schema can say, refused 422 `invalid_arguments`/`config_error`.
        "operations": [
            {
                "include-operation-id": "approveInvocation",
                "checks": {"positive_data_acceptance": {"expected-statuses": [*ACCEPTED, "422"]}},
            }
        ],
    }
)

PENDING = [f"inv-{n:04d}" for n in range(1, 31)]
"""Seeded pending invocations, so generated decisions (with generated notes) reach the ledger."""


async def _populate(live: Live) -> None:
    """Invocations to decide (pending, one expired, one by the admin itself) and a drifted pin."""
    await seed(live.ledger, *(invocation(n) for n in range(1, len(PENDING) + 1)))
    await seed(
        live.ledger,
        invocation(900, expires_at=utcnow() - timedelta(seconds=1)),
        invocation(901, principal="alice"),
    )
    pin = Pin(source_id="fx", action_id="echo", pinned=observation("Echo."), drift=observation("Exfiltrate."))
    await live.ledger.pins.save_pin(pin)


Operation = APIOperation[Any, Any, Any, Any]


def fuzz(
    operation: Operation, mode: GenerationMode, *, headers: dict[str, str], sent: Counter[str], answered: Counter[int]
) -> None:
    """Send `EXAMPLES` generated requests to one route and check each answer against the document."""
    ids = st.sampled_from(["inv-0900", "inv-0901", "no-such-invocation", *PENDING])

    @given(case=operation.as_strategy(generation_mode=mode), target=ids)
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: Case[Operation], target: str) -> None:
        # Valid requests aim at invocations that exist, so decisions are really made and refused.
        if mode is GenerationMode.POSITIVE and "invocation_id" in (case.path_parameters or {}):
            case.path_parameters = {"invocation_id": target}
        # A query value of None or [] is not sent at all by the HTTP client: such a "negative" request arrives valid.
        assume(not any(value is None or value == [] for value in (case.query or {}).values()))
        sent[operation.label] += 1
        answered[case.call_and_validate(headers=headers, timeout=WAIT).status_code] += 1

    check()


def test_every_answer_of_the_api_conforms_to_its_openapi_document(tmp_path: Path) -> None:
    with (
        start_blocking_portal(backend="asyncio") as portal,
        portal.wrap_async_context_manager(live_bastion(tmp_path)) as live,
    ):
        admin = portal.call(live.token, "alice", "admin")
        portal.call(_populate, live)
        schema = schemathesis.openapi.from_url(
            f"{live.url}/api/openapi.json", config=CONFIG, headers=admin, timeout=WAIT
        )
        sent: Counter[str] = Counter()
        answered: Counter[int] = Counter()
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                fuzz(result.ok(), mode, headers=admin, sent=sent, answered=answered)

        # schemathesis leaves out the route that serves the document itself: from_url has fetched it.
        documented = {f"{m.upper()} {path}" for path, item in schema.raw_schema["paths"].items() for m in item}
        assert set(sent) == documented - {"GET /api/openapi.json"}
        assert {200, 401, 404, 409, 422} <= set(answered)
        decided = portal.call(live.ledger.invocations.list)
        assert any(i.status in ("approved", "denied") for i in decided)


form_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
forms = st.dictionaries(st.sampled_from(["csrf", "token", "note", "reason", "scope", "extra"]), form_text, max_size=5)
INBOX_POSTS = ["/inbox/login", "/inbox/logout", "/inbox/approvals/inv-0001/approve", "/inbox/approvals/inv-0002/deny"]


def test_inbox_forms_and_resume_points_of_any_shape_are_refused_or_served_never_failed(tmp_path: Path) -> None:
    """The inbox's forms and the streams' Last-Event-ID are not in the OpenAPI document: generated forms (any
    fields, any text, with the session's real CSRF token or not) and resume points (any text, any number) get a
    refusal or their page, never a 5xx; and only a form carrying the session's CSRF token decides anything."""
    with (
        start_blocking_portal(backend="asyncio") as portal,
        portal.wrap_async_context_manager(live_bastion(tmp_path)) as live,
    ):
        secret = portal.call(live.token, "alice", "admin")["Authorization"].removeprefix("Bearer ")
        portal.call(seed, live.ledger, invocation(1), invocation(2))
        with httpx2.Client(base_url=live.url, timeout=WAIT, follow_redirects=False) as http:
            login = http.get("/inbox/login")
            found = re.search(r'name=csrf value="([^"]+)"', login.text)
            assert found is not None
            assert http.post("/inbox/login", data={"csrf": found.group(1), "token": secret}).status_code == 303
            page = re.search(r'name=csrf value="([^"]+)"', http.get("/inbox").text)
            assert page is not None
            csrf = page.group(1)

            @given(path=st.sampled_from(INBOX_POSTS), form=forms, real_csrf=st.booleans())
            @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None)
            def post(path: str, form: dict[str, str], real_csrf: bool) -> None:
                if path == "/inbox/logout":
                    assume(not real_csrf)  # a real logout would end the session the other examples use
                sent = form | {"csrf": csrf} if real_csrf else form
                answer = http.post(path, data=sent)
                assert answer.status_code < 500, (path, sent, answer.text[:200])
                if not real_csrf:
                    assert answer.status_code in (303, 403, 422), (path, sent)

            post()
            undecided = {i.id for i in portal.call(live.ledger.invocations.list) if i.status == "pending"}
            assert undecided <= {"inv-0001", "inv-0002"}

            @given(resume=st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str), form_text))
            @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None)
            def resume(resume: str) -> None:
                assume(resume.isascii() and resume == resume.strip() and "\n" not in resume and "\r" not in resume)
                for path, headers in (("/api/events", {"Authorization": f"Bearer {secret}"}), ("/inbox/events", {})):
                    with http.stream("GET", path, headers=headers | {"Last-Event-ID": resume}) as answer:
                        assert answer.status_code in (200, 400, 422), (
                            path,
                            resume,
                            answer.status_code,
                        )  # 400: the HTTP parser's

            resume()

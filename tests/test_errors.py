"""One registry of error classes, and the translators at each boundary beside each other."""

from __future__ import annotations

import json

import pytest

from bastion.errors import ERROR_CLASSES, BastionError
from bastion.server.errors import ERROR_META_KEY, from_http, http_response, tool_result

DESIGN_STATUSES = {
    "not_found": 404,
    "approval_expired": 410,
    "conflict": 409,
    "pending_limit": 429,
    "rate_limited": 429,
    "upstream_error": 502,
    "connector_unavailable": 502,
    "timeout": 502,
    "unknown_outcome": 502,
    "unauthenticated": 401,
    "forbidden": 403,
    "invalid_arguments": 422,
    "policy_denied": 403,
    "approval_denied": 403,
    "source_disabled": 403,
}


def test_every_refusal_of_design_has_its_status_and_none_is_a_500() -> None:
    for error_class, status in DESIGN_STATUSES.items():
        assert ERROR_CLASSES[error_class].http_status == status, error_class
    assert [name for name, cls in ERROR_CLASSES.items() if cls.http_status == 500] == ["internal"]


@pytest.mark.parametrize("error_class", sorted(ERROR_CLASSES))
def test_an_http_refusal_reads_back_as_the_same_error(error_class: str) -> None:
    sent = ERROR_CLASSES[error_class]("what happened; how to fix it", invocation_id="inv-1")
    response = http_response(sent)
    assert response.status_code == sent.http_status
    received = from_http(response.status_code, json.loads(bytes(response.body)))
    assert received is not None
    assert type(received) is type(sent)
    assert (received.message, received.invocation_id) == (sent.message, "inv-1")


def test_an_answer_without_an_error_body_is_not_read_as_one() -> None:
    assert from_http(502, {"detail": "bad gateway"}) is None
    assert from_http(502, "<html>") is None


def test_a_tool_result_names_the_class_in_text_structured_content_and_meta() -> None:
    refused = tool_result(ERROR_CLASSES["policy_denied"]("policy (org) denies fs:rm", invocation_id="inv-2"))
    assert refused.is_error
    assert refused.structured_content is not None
    error = refused.structured_content["error"]
    assert (error["class"], error["invocation_id"], error["retriable"]) == ("policy_denied", "inv-2", False)
    assert refused.meta is not None and refused.meta[ERROR_META_KEY] == error
    assert refused.content[0].type == "text" and refused.content[0].text.startswith("policy_denied: ")


def test_for_a_tool_with_an_output_schema_the_error_stays_out_of_structured_content() -> None:
    refused = tool_result(BastionError("boom"), output_schema=True)
    assert refused.is_error
    assert refused.structured_content is None
    assert refused.meta is not None and refused.meta[ERROR_META_KEY]["class"] == "internal"

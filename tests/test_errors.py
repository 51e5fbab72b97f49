"""One registry of error classes, and the translators at each boundary beside each other."""

from __future__ import annotations

import json

import mcp_types as types
import pytest
from mcp_types import methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

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


@pytest.mark.parametrize("version", KNOWN_PROTOCOL_VERSIONS)
def test_a_tool_result_names_the_class_in_text_structured_content_and_meta(version: str) -> None:
    denied = ERROR_CLASSES["policy_denied"]("policy (org) denies fs:rm", invocation_id="inv-2")
    refused = types.CallToolResult.model_validate(tool_result(denied, version=version), by_name=False)
    assert refused.is_error
    assert refused.structured_content is not None
    error = refused.structured_content["error"]
    assert (error["class"], error["invocation_id"], error["retriable"]) == ("policy_denied", "inv-2", False)
    assert refused.meta is not None and refused.meta[ERROR_META_KEY] == error
    assert refused.content[0].type == "text" and refused.content[0].text.startswith("policy_denied: ")


@pytest.mark.parametrize("version", KNOWN_PROTOCOL_VERSIONS)
def test_a_tool_result_has_the_shape_of_the_hosts_protocol_version(version: str) -> None:
    refused = tool_result(BastionError("boom"), version=version)
    methods.validate_server_result("tools/call", version, refused)
    assert ("resultType" in refused) == (version in MODERN_PROTOCOL_VERSIONS)


def test_for_a_tool_with_an_output_schema_the_error_stays_out_of_structured_content() -> None:
    refused = tool_result(BastionError("boom"), version="2026-07-28", output_schema=True)
    assert refused["isError"] is True
    assert "structuredContent" not in refused
    assert refused["_meta"][ERROR_META_KEY]["class"] == "internal"

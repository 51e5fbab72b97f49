"""Redaction and structural truncation of what the ledger persists (DESIGN.md §6 "Redaction")."""

from __future__ import annotations

import copy
import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.ledger.redaction import REDACTED, SECRET_KEY_PARTS, Redactor

ALNUM = string.ascii_letters + string.digits
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"


def compact_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


redactor = Redactor()


# -- secret keys ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("part", SECRET_KEY_PARTS)
def test_every_secret_key_part_redacts_its_value(part: str) -> None:
    value = {part: "v1", part.upper(): "v2", f"x_{part}_y": "v3", "other": "kept"}
    assert redactor.redact(value) == {part: REDACTED, part.upper(): REDACTED, f"x_{part}_y": REDACTED, "other": "kept"}


@pytest.mark.parametrize("key", ["api-key", "X-Api-Key", "x-api-key", "Private-Key", "client-secret", "Access-Key-Id"])
def test_dash_and_underscore_are_equivalent_in_keys(key: str) -> None:
    assert redactor.redact({key: "v"}) == {key: REDACTED}


@pytest.mark.parametrize("key", ["name", "path", "author", "keyboard", "pass", "cookbook", "query", "id"])
def test_ordinary_keys_are_kept(key: str) -> None:
    assert redactor.redact({key: "value"}) == {key: "value"}


def test_any_value_under_a_secret_key_is_replaced_whole() -> None:
    value = {"credentials": {"user": "bob", "pw": "x"}, "tokens": [1, 2], "cookie": None, "secret": 42}
    assert redactor.redact(value) == {
        "credentials": REDACTED,
        "tokens": REDACTED,
        "cookie": REDACTED,
        "secret": REDACTED,
    }


def test_secret_keys_are_found_at_any_depth() -> None:
    value = {"a": [{"b": {"Authorization": "Basic dXNlcjpwYXNz", "keep": 1}}, "plain"]}
    assert redactor.redact(value) == {"a": [{"b": {"Authorization": REDACTED, "keep": 1}}, "plain"]}


def test_extra_secret_keys_are_matched_like_the_builtin_ones() -> None:
    extra = Redactor(extra_secret_keys=["session_id", "PIN"])
    value = {"X-Session-Id": "s", "user_pin": "1234", "name": "n"}
    assert extra.redact(value) == {"X-Session-Id": REDACTED, "user_pin": REDACTED, "name": "n"}
    assert extra.redact("session-id=abc&pin=1234&page=2") == "session-id=[REDACTED]&pin=[REDACTED]&page=2"
    assert redactor.redact({"session_id": "s"}) == {"session_id": "s"}


# -- credential-looking strings ------------------------------------------------------------------------------

CREDENTIALS = [
    JWT,
    "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",  # unsigned JWT
    *(f"gh{kind}_{'Z' * 18}{'9' * 18}" for kind in "pousr"),
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVW",
    *(f"xox{kind}-1234567890-0987654321-abcdefABCDEF" for kind in "abprs"),
    "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2",
    "sk-ant-api03-" + "x" * 40,
    "sk-proj-" + "Ab3" * 20,
    "AKIAIOSFODNN7EXAMPLE",
]


@pytest.mark.parametrize("credential", CREDENTIALS)
def test_credentials_are_replaced_keeping_the_surrounding_text(credential: str) -> None:
    assert redactor.redact(f"use {credential} now") == f"use {REDACTED} now"
    assert redactor.redact(credential) == REDACTED
    assert redactor.redact([{"note": f"({credential})"}]) == [{"note": f"({REDACTED})"}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Bearer abcdef123456", f"Bearer {REDACTED}"),
        (f"curl -H 'X: bearer {JWT}' x", f"curl -H 'X: bearer {REDACTED}' x"),
        ("Bearer ABCDEFGHIJKLMNOPQRSTUVWXYZ", f"Bearer {REDACTED}"),
        ("https://bob:hunter2@example.com/x", f"https://bob:{REDACTED}@example.com/x"),
        ("redis://:s3cr3t@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0"),
        ("postgresql://app:p@ss:w0rd@db/prod", f"postgresql://app:{REDACTED}@db/prod"),
    ],
)
def test_bearer_tokens_and_url_passwords_keep_their_context(text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "tokenize the input",
        "the bearer of bad news",
        "Bearer tokens are described in RFC 6750",
        "eyJhbGciOiJIUzI1NiJ9 alone is just a header",
        "ghp_tooShort1234",
        "ghx_" + "a" * 36,
        "github_pat_short",
        "xoxq-1234567890-abcdef",
        "xoxb-123",
        "sk-short",
        "sk-",
        "task-abcdefghijklmnopqrstuvwxyz0123",
        "a risk-free change",
        "AKIA123",
        "akiaiosfodnn7example",
        "https://example.com:8080/path@v2",
        "https://bob@example.com/",
        "password reset instructions were sent",
        "a secret santa list",
        "[1, 2, 3]",
        "",
    ],
)
def test_ordinary_text_is_kept(text: str) -> None:
    assert redactor.redact(text) == text


# -- text with embedded structure ----------------------------------------------------------------------------


def test_json_in_a_string_is_parsed_redacted_and_reserialised() -> None:
    text = json.dumps({"user": "bob", "token": "abc", "items": [{"api_key": "k"}]})
    assert json.loads(redactor.redact(text)) == {"user": "bob", "token": REDACTED, "items": [{"api_key": REDACTED}]}
    array = json.dumps([f"Bearer {JWT}", 1])
    assert json.loads(redactor.redact(array)) == [f"Bearer {REDACTED}", 1]


def test_json_in_a_string_without_secrets_keeps_its_formatting() -> None:
    text = '{\n  "a": [1,  2],\n  "b": "ok"\n}'
    assert redactor.redact(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2&x=1", "password=[REDACTED]&x=1"),
        ("GET /cb?code=1&access_token=abc.def&state=s", "GET /cb?code=1&access_token=[REDACTED]&state=s"),
        ("user=bob token: abc123 done", "user=bob token: [REDACTED] done"),
        ('broken {"api_key": "a b c", "n": 1', 'broken {"api_key": "[REDACTED]", "n": 1'),
        ("{'client_secret': 'xyz', 'id': 7}", "{'client_secret': '[REDACTED]', 'id': 7}"),
        ("Authorization: Basic dXNlcjpwYXNz\nHost: x", "Authorization: [REDACTED]\nHost: x"),
        ("X-Api-Key = k-123; path=/", "X-Api-Key = [REDACTED]; path=/"),
    ],
)
def test_secret_key_value_pairs_in_text_lose_their_value(text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


def test_redaction_never_mutates_its_input() -> None:
    value = {"password": "p", "list": [{"token": "t"}, f"Bearer {JWT}"], "n": 1, "text": "password=x"}
    before = copy.deepcopy(value)
    redactor.redact(value)
    Redactor(max_bytes=64).scrub(value)
    assert value == before


def test_tuples_become_lists_and_other_objects_their_text() -> None:
    class Thing:
        def __str__(self) -> str:
            return f"thing with {GHP}"

    assert redactor.redact({"t": (1, "a"), "o": Thing(), 3: "int key"}) == {
        "t": [1, "a"],
        "o": f"thing with {REDACTED}",
        "3": "int key",
    }


def test_credential_looking_dict_keys_are_redacted() -> None:
    assert redactor.redact({GHP: {"user": "bob"}}) == {REDACTED: {"user": "bob"}}


# -- truncation ----------------------------------------------------------------------------------------------


def test_a_value_within_the_limit_is_returned_unchanged() -> None:
    value = {"a": [1, 2, "three"], "b": None}
    assert Redactor(max_bytes=64).truncate(value) is value


def test_long_strings_are_cut_with_a_marker() -> None:
    out = Redactor(max_bytes=100).truncate("é" * 1000)
    assert isinstance(out, str)
    assert out.startswith("éé")
    assert out.endswith("chars]")
    kept = out.index("…")
    assert out[kept:] == f"…[truncated {1000 - kept} chars]"
    assert compact_size(out) <= 100


def test_long_lists_keep_a_prefix_and_count_the_rest() -> None:
    out = Redactor(max_bytes=100).truncate(list(range(1000)))
    assert out[:5] == [0, 1, 2, 3, 4]
    assert out[-1] == f"[truncated {1000 - (len(out) - 1)} more items]"
    assert compact_size(out) <= 100


def test_big_dicts_keep_a_prefix_of_keys_and_count_the_rest() -> None:
    value = {f"k{i}": i for i in range(500)}
    out = Redactor(max_bytes=120).truncate(value)
    kept = [key for key in out if key != "_truncated"]
    assert kept == [f"k{i}" for i in range(len(kept))]
    assert out["_truncated"] == f"[truncated {500 - len(kept)} more keys]"
    assert compact_size(out) <= 120


def test_truncation_works_top_down_keeping_what_fits() -> None:
    value = {"status": "ok", "content": [{"type": "text", "text": "x" * 5000}], "tail": "y" * 100}
    out = Redactor(max_bytes=1000).truncate(value)
    assert out["status"] == "ok"
    assert out["content"][0]["type"] == "text"
    assert out["content"][0]["text"].startswith("xxx")
    assert "tail" not in out
    assert out["_truncated"] == "[truncated 1 more keys]"
    assert 900 < compact_size(out) <= 1000


def test_an_existing_truncated_key_is_not_overwritten() -> None:
    value = {"_truncated": "mine", **{f"k{i}": "v" * 20 for i in range(50)}}
    out = Redactor(max_bytes=200).truncate(value)
    assert out["_truncated"] == "mine"
    assert out["__truncated"].startswith("[truncated ")


def test_when_nothing_sensible_fits_a_preview_is_returned() -> None:
    out = Redactor(max_bytes=128).truncate(10**200)
    assert out["_truncated"] is True
    assert out["original_bytes"] == 201
    assert out["preview"].startswith("1000")
    assert compact_size(out) <= 128


def test_max_bytes_below_the_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        Redactor(max_bytes=10)


def test_scrub_redacts_before_truncating() -> None:
    out = Redactor(max_bytes=64).scrub({"a": f"{GHP} " + "x" * 500})
    assert GHP not in json.dumps(out)
    assert out["a"].startswith(REDACTED)


# -- properties ----------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**128), max_value=2**128)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=12), children, max_size=8),
    max_leaves=40,
)


@settings(deadline=None)
@given(value=json_values, max_bytes=st.integers(min_value=64, max_value=4096))
def test_truncate_always_fits_and_round_trips(value: Any, max_bytes: int) -> None:
    out = Redactor(max_bytes=max_bytes).truncate(value)
    serialised = json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    assert len(serialised.encode()) <= max_bytes
    assert json.loads(serialised) == out
    if compact_size(value) <= max_bytes:
        assert out is value


@settings(deadline=None)
@given(value=json_values, max_bytes=st.integers(min_value=64, max_value=4096))
def test_scrub_json_is_the_compact_text_of_scrub(value: Any, max_bytes: int) -> None:
    scrubbing = Redactor(max_bytes=max_bytes)
    assert scrubbing.scrub_json(value) == json.dumps(scrubbing.scrub(value), ensure_ascii=False, separators=(",", ":"))


@settings(deadline=None)
@given(value=json_values)
def test_redaction_is_idempotent(value: Any) -> None:
    once = redactor.redact(value)
    assert redactor.redact(once) == once


@st.composite
def with_canary(draw: st.DrawFn) -> tuple[Any, str, str]:
    """A JSON value with a GitHub token placed somewhere in it; returns (value, canary, text without it)."""
    canary = "ghp_" + draw(st.text(alphabet=ALNUM, min_size=36, max_size=36))
    prefix, suffix, key = draw(st.text(max_size=10)), draw(st.text(max_size=10)), draw(st.text(max_size=10))
    carrier = draw(st.sampled_from(["bare", "in_text", "in_json_text"]))
    leaf: str = {
        "bare": canary,
        "in_text": prefix + canary + suffix,
        "in_json_text": json.dumps({key: [prefix + canary + suffix]}),
    }[carrier]

    def place(value: Any) -> Any:
        if isinstance(value, dict) and value and draw(st.booleans()):
            chosen = draw(st.sampled_from(sorted(value)))
            return {**value, chosen: place(value[chosen])}
        if isinstance(value, list) and value and draw(st.booleans()):
            index = draw(st.integers(min_value=0, max_value=len(value) - 1))
            return [*value[:index], place(value[index]), *value[index + 1 :]]
        if isinstance(value, dict):
            return {**value, key: leaf}
        if isinstance(value, list):
            index = draw(st.integers(min_value=0, max_value=len(value)))
            return [*value[:index], leaf, *value[index:]]
        if isinstance(value, str) and draw(st.booleans()):
            cut = draw(st.integers(min_value=0, max_value=len(value)))
            return value[:cut] + leaf + value[cut:]
        return [value, leaf]

    base = draw(json_values)
    return place(base), canary, json.dumps([base, prefix, suffix, key], ensure_ascii=False)


@settings(deadline=None)
@given(case=with_canary(), max_bytes=st.integers(min_value=64, max_value=4096))
def test_a_canary_secret_never_survives_scrubbing(case: tuple[Any, str, str], max_bytes: int) -> None:
    value, canary, elsewhere = case
    stored = json.dumps(Redactor(max_bytes=max_bytes).scrub(value), ensure_ascii=False)
    assert canary not in stored
    body = canary.removeprefix("ghp_")
    if body not in elsewhere:
        assert body not in stored

"""Redaction and structural truncation of what the ledger persists."""

from __future__ import annotations

import base64
import copy
import json
import string
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bastion.jsontext import compact
from bastion.ledger.redaction import REDACTED, SECRET_KEY_PARTS, Redactor

ALNUM = string.ascii_letters + string.digits
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"


def compact_size(value: Any) -> int:
    """Bytes of the compact JSON text the ledger stores."""
    return len(compact(value).encode())


redactor = Redactor()


# -- secret keys ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("part", SECRET_KEY_PARTS)
def test_every_secret_key_part_redacts_its_value(part: str) -> None:
    value = {part: "v1", part.upper(): "v2", f"x_{part}_y": "v3", "other": "kept"}
    assert redactor.redact(value) == {part: REDACTED, part.upper(): REDACTED, f"x_{part}_y": REDACTED, "other": "kept"}


@pytest.mark.parametrize("key", ["api-key", "X-Api-Key", "x-api-key", "Private-Key", "client-secret", "Access-Key-Id"])
def test_dash_and_underscore_are_equivalent_in_keys(key: str) -> None:
    assert redactor.redact({key: "v"}) == {key: REDACTED}


@pytest.mark.parametrize(
    "key",
    [
        *("privateKey", "accessKey", "clientSecret", "APIKey", "xApiKey", "apiKeys", "accessKeyId"),
        *("passphrase", "sessionid", "sessionId", "PHPSESSID", "JSESSIONID", "Set-Cookie", "Cookies"),
        *("authToken", "csrftoken", "OAuthToken", "X-Auth-Token", "refresh_token", "tokens", "id_token"),
        *("dbPassword", "userPwd", "password2", "passwordHash", "AWS_SECRET_ACCESS_KEY", "x.api.key"),
    ],
)
def test_camel_case_compound_and_plural_keys_are_secret(key: str) -> None:
    assert redactor.redact({key: "v", "other": "kept"}) == {key: REDACTED, "other": "kept"}
    assert redactor.redact(f"{key}=v1 other=kept") == f"{key}=[REDACTED] other=kept"


@pytest.mark.parametrize(
    "key",
    [
        *("name", "path", "author", "keyboard", "pass", "cookbook", "query", "id", "monkey", "publicKey"),
        *("tokenizer", "tokenize", "secretary", "passage", "bypass", "compass", "session", "sessions"),
        # `token` counts and page cursors: ordinary data in LLM usage reports and paginated listings.
        *("tokens_used", "max_tokens", "input_tokens", "totalTokens", "completionTokens", "token_count"),
        *("nextPageToken", "page_token", "NextToken"),
    ],
)
def test_ordinary_keys_are_kept(key: str) -> None:
    assert redactor.redact({key: "value"}) == {key: "value"}
    assert redactor.redact(f"{key}=value") == f"{key}=value"


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
    extra = Redactor(extra_secret_keys=["tenant_ref", "PIN"])
    value = {"X-Tenant-Ref": "s", "user_pin": "1234", "tenantRef": "t", "name": "n", "spinner": "kept"}
    assert extra.redact(value) == {
        "X-Tenant-Ref": REDACTED,
        "user_pin": REDACTED,
        "tenantRef": REDACTED,
        "name": "n",
        "spinner": "kept",
    }
    assert extra.redact("tenant-ref=abc&pin=1234&page=2") == "tenant-ref=[REDACTED]&pin=[REDACTED]&page=2"
    assert redactor.redact({"tenant_ref": "s"}) == {"tenant_ref": "s"}


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
    "bst_" + "Xy0_-" * 8 + "abc",  # Bastion's own token: bst_ and 43 URL-safe base64 characters
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
        ("privateKey=abc123 accessKey: xyz", "privateKey=[REDACTED] accessKey: [REDACTED]"),
        ("Cookie: sessionid=abc123; csrftoken=def456", "Cookie: [REDACTED]; csrftoken=[REDACTED]"),
        ('password: "left open, to the end', 'password: "[REDACTED]"'),
        ("note: password=x", "note: password=[REDACTED]"),
    ],
)
def test_secret_key_value_pairs_in_text_lose_their_value(text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Server=db;Database=app;User Id=sa;Pwd=s3cret pass;Encrypt=yes",
            "Server=db;Database=app;User Id=sa;Pwd=[REDACTED];Encrypt=yes",
        ),
        ("Data Source=x;Password=two words;", "Data Source=x;Password=[REDACTED];"),
        ("Driver={ODBC 18};UID=sa;PWD={p;w d};", "Driver={ODBC 18};UID=sa;PWD=[REDACTED];"),
        ("mysql://app:hunter2@db/prod?ssl=1", "mysql://app:[REDACTED]@db/prod?ssl=1"),
    ],
)
def test_passwords_in_connection_strings_lose_their_value(text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            r"log: {\"password\": \"hunter2\", \"user\": \"bob\"}",
            r"log: {\"password\": \"[REDACTED]\", \"user\": \"bob\"}",
        ),
        (r"twice: {\\\"apiKey\\\": \\\"k-1\\\"}", r"twice: {\\\"apiKey\\\": \\\"[REDACTED]\\\"}"),
        (r"a quote inside: {\"token\": \"a\\\"b c\"}", r"a quote inside: {\"token\": \"[REDACTED]\"}"),
    ],
)
def test_escaped_json_in_text_loses_its_secret_values(text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("send Basic dXNlcjpwYXNzd29yZA== to the proxy", "send Basic [REDACTED] to the proxy"),
        ("curl -H 'X-Upstream: basic YWxpY2U6czNjcjN0' x", "curl -H 'X-Upstream: basic [REDACTED]' x"),
        ("Basic usage of the API", "Basic usage of the API"),
        ("Basic authentication is described in RFC 7617", "Basic authentication is described in RFC 7617"),
        ("Basic Zm9vYmFy is foobar, no colon", "Basic Zm9vYmFy is foobar, no colon"),
    ],
)
def test_basic_credentials_go_only_when_they_decode_to_user_and_password(text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"


@pytest.mark.parametrize("kind", ["", "RSA ", "EC ", "OPENSSH ", "ENCRYPTED "])
def test_pem_private_key_blocks_keep_only_their_header_and_footer(kind: str) -> None:
    block = f"-----BEGIN {kind}PRIVATE KEY-----\n{PEM_BODY}\n-----END {kind}PRIVATE KEY-----"
    expected = f"-----BEGIN {kind}PRIVATE KEY-----{REDACTED}-----END {kind}PRIVATE KEY-----"
    assert redactor.redact(f"key:\n{block}\nthanks") == f"key:\n{expected}\nthanks"
    assert redactor.redact({"pem": block}) == {"pem": expected}
    escaped = json.dumps({"file": block})
    assert PEM_BODY.split("\n")[1] not in redactor.redact(f"upload {escaped} done")


def test_a_pem_private_key_cut_short_is_redacted_to_the_end() -> None:
    text = f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n{PEM_BODY}"
    assert redactor.redact(f"here: {text}") == f"here: -----BEGIN PGP PRIVATE KEY BLOCK-----{REDACTED}"


def test_a_long_chain_of_pairs_in_text_is_redacted_without_recursion() -> None:
    text = "k:" + "a:" * 5000 + "password=hunter2 " + "b: " * 5000 + "token=t1"
    out = redactor.redact(text)
    assert "hunter2" not in out
    assert out.endswith("token=[REDACTED]")


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
    serialised = compact(out)
    assert len(serialised.encode()) <= max_bytes
    assert json.loads(serialised) == out
    if compact_size(value) <= max_bytes:
        assert out is value


@settings(deadline=None)
@given(value=json_values, max_bytes=st.integers(min_value=64, max_value=4096))
def test_scrub_json_is_the_compact_text_of_scrub(value: Any, max_bytes: int) -> None:
    scrubbing = Redactor(max_bytes=max_bytes)
    assert scrubbing.scrub_json(value) == compact(scrubbing.scrub(value))


@settings(deadline=None)
@given(value=json_values)
def test_redaction_is_idempotent(value: Any) -> None:
    once = redactor.redact(value)
    assert redactor.redact(once) == once


def placed(draw: st.DrawFn, value: Any, key: str, leaf: str, *, in_text: bool = False) -> Any:
    """`value` with `leaf` placed somewhere in it, drawn: under `key` in an object, in an array, inside a string
    (`in_text`), or beside the value in a new array."""

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
        if in_text and isinstance(value, str) and draw(st.booleans()):
            cut = draw(st.integers(min_value=0, max_value=len(value)))
            return value[:cut] + leaf + value[cut:]
        return [value, leaf]

    return place(value)


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

    base = draw(json_values)
    return (
        placed(draw, base, key, leaf, in_text=True),
        canary,
        json.dumps([base, prefix, suffix, key], ensure_ascii=False),
    )


@settings(deadline=None)
@given(case=with_canary(), max_bytes=st.integers(min_value=64, max_value=4096))
def test_a_canary_secret_never_survives_scrubbing(case: tuple[Any, str, str], max_bytes: int) -> None:
    value, canary, elsewhere = case
    stored = json.dumps(Redactor(max_bytes=max_bytes).scrub(value), ensure_ascii=False)
    assert canary not in stored
    body = canary.removeprefix("ghp_")
    if body not in elsewhere:
        assert body not in stored


# -- property: no generated secret survives ------------------------------------------------------------------

B64URL = ALNUM + "-_"
QUOTABLE = ALNUM + " !#$%&()*+,-./:;<=>?@[]^_`{|}~"  # what a quoted value may hold here: no quote, no backslash
UNQUOTED = ALNUM + "!#$%()*+-./:=?@[]^_`{|}~"  # an unquoted value: no space and no delimiter
CONNECTION = ALNUM + " !#$%()*+-./:?@[]^_`|~"  # a connection-string value: spaces, no `;` `=` or quotes
SURROUNDING = st.text(alphabet=st.characters(blacklist_characters="\"'\\", blacklist_categories=["Cs"]), max_size=20)
SECRET_KEY_SPELLINGS = (
    *("password", "Password", "passwd", "PWD", "passphrase", "privateKey", "private_key", "accessKey"),
    *("AWS_SECRET_ACCESS_KEY", "clientSecret", "client_secret", "APIKey", "xApiKey", "x-api-key", "api_key"),
    *("apikey", "sessionid", "sessionId", "authToken", "access_token", "X-Auth-Token", "secret", "credentials"),
    *("Authorization", "cookie", "csrftoken"),
)


@st.composite
def credentials(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A credential of one supported shape, and its random parts: none of them may ever be stored."""

    def chars(alphabet: str, low: int, high: int | None = None) -> str:
        return draw(st.text(alphabet=alphabet, min_size=low, max_size=low + 24 if high is None else high))

    shape = draw(st.sampled_from(["jwt", "github", "github_pat", "slack", "openai", "aws", "bastion", "url"]))
    shape = draw(st.sampled_from([shape, "bearer", "basic", "pem"]))
    core: str
    if shape == "jwt":
        core = chars(B64URL, 16)
        return f"eyJ{chars(B64URL, 5)}.eyJ{core}.{chars(B64URL, 0)}", [core]
    if shape == "github":
        core = chars(ALNUM, 36)
        return f"gh{draw(st.sampled_from('pousr'))}_{core}", [core]
    if shape == "github_pat":
        core = chars(ALNUM + "_", 22, 82)
        return f"github_pat_{core}", [core]
    if shape == "slack":
        core = chars(B64URL, 16)
        return f"xox{draw(st.sampled_from('abprs'))}-{core}", [core]
    if shape == "openai":
        core = chars(B64URL, 20)
        return f"sk-{draw(st.sampled_from(['', 'ant-api03-', 'proj-']))}{core}", [core]
    if shape == "aws":
        core = chars(string.ascii_uppercase + string.digits, 16, 16)
        return draw(st.sampled_from(["AKIA", "ASIA"])) + core, [core]
    if shape == "bastion":
        core = chars(B64URL, 43, 43)
        return f"bst_{core}", [core]
    if shape == "url":
        core = chars(ALNUM + "-._~!$*+,;=", 12)
        scheme = draw(st.sampled_from(["postgresql", "mysql", "redis", "https", "amqp"]))
        return f"{scheme}://{chars(ALNUM, 0, 8)}:{core}@db.example:5432/app", [core]
    if shape == "bearer":
        core = chars(ALNUM + "-._~+/", 20)
        return f"Bearer {core}", [core]
    if shape == "basic":
        user, password = chars(ALNUM, 1, 12), chars(ALNUM + "!#$%&*+-.:@^_~", 8)
        core = base64.b64encode(f"{user}:{password}".encode()).decode()
        return f"{draw(st.sampled_from(['Basic', 'basic']))} {core}", [core]
    kind = draw(st.sampled_from(["", "RSA ", "EC ", "DSA ", "OPENSSH ", "ENCRYPTED "]))
    lines = draw(st.lists(st.text(alphabet=ALNUM + "+/", min_size=16, max_size=64), min_size=1, max_size=4))
    body = "\n".join(lines)
    return f"-----BEGIN {kind}PRIVATE KEY-----\n{body}\n-----END {kind}PRIVATE KEY-----", lines


@st.composite
def carried_credentials(draw: st.DrawFn) -> tuple[Any, list[str], list[str]]:
    """A credential as a value, in text, in a header, in JSON text or in escaped JSON in text; returns
    (the carrier, the secret parts, the surrounding text)."""
    credential, cores = draw(credentials())
    prefix, suffix, key = draw(SURROUNDING), draw(SURROUNDING), draw(st.text(max_size=10))
    in_text = f"{prefix} {credential} {suffix}"
    carrier = draw(st.sampled_from(["bare", "text", "header", "json_text", "escaped_json", "escaped_twice"]))
    once = json.dumps({key: [in_text]}, ensure_ascii=False)
    leaf = {
        "bare": credential,
        "text": in_text,
        "header": f"{prefix}\nAuthorization: {credential}\n{suffix}",
        "json_text": once,
        "escaped_json": f"{prefix} {json.dumps(once, ensure_ascii=False)[1:-1]} {suffix}",
        "escaped_twice": json.dumps(json.dumps(once, ensure_ascii=False), ensure_ascii=False)[1:-1],
    }[carrier]
    return leaf, cores, [prefix, suffix, key]


@st.composite
def secret_pairs(draw: st.DrawFn) -> tuple[Any, list[str], list[str]]:
    """A value under a secret key: in a dict, as `key=value` or `key: value` text, as JSON or escaped JSON in
    text, in a connection string, in an HTTP header or cookie; returns (the carrier, [value], surrounding)."""
    key = draw(st.sampled_from(SECRET_KEY_SPELLINGS))
    quoted, unquoted = draw(st.text(alphabet=QUOTABLE, min_size=12)), draw(st.text(alphabet=UNQUOTED, min_size=12))
    prefix, suffix = draw(SURROUNDING), draw(SURROUNDING)
    form = draw(
        st.sampled_from(
            ["dict", "equals", "colon", "json", "single", "escaped", "escaped_twice", "connection", "header", "cookie"]
        )
    )
    if form == "dict":
        return {key: quoted, "note": prefix}, [quoted], [prefix, suffix]
    if form == "connection":
        value = draw(st.text(alphabet=CONNECTION, min_size=12)).strip() or "x" * 12
        name = draw(st.sampled_from(["Password", "Pwd", "PWD", "password"]))
        return f"Server=db.example;Database=app;User Id=sa;{name}={value};Encrypt=yes", [value], [prefix, suffix]
    if form == "cookie":
        name = draw(st.sampled_from(["sessionid", "PHPSESSID", "JSESSIONID", "csrftoken", "session_id", "auth_token"]))
        return f"{prefix}\nCookie: theme=dark; {name}={unquoted}; lang=en\n{suffix}", [unquoted], [prefix, suffix]
    value = quoted if form in ("json", "single", "escaped", "escaped_twice") else unquoted
    text = {
        "equals": f"{key}={value}",
        "colon": f"{key}: {value}",
        "json": json.dumps({key: value}),
        "single": f"{{'{key}': '{value}'}}",
        "escaped": json.dumps(json.dumps({key: value}))[1:-1],
        "escaped_twice": json.dumps(json.dumps(json.dumps({key: value})))[1:-1],
        "header": f"{draw(st.sampled_from(['X-Api-Key', 'X-Auth-Token', 'Authorization']))}: {value}",
    }[form]
    return f"{prefix} {text} {suffix}", [value], [prefix, suffix]


@st.composite
def placed_secrets(draw: st.DrawFn) -> tuple[Any, list[str], str]:
    """Generated JSON with a generated secret placed as a value somewhere in it; returns
    (value, the secret parts, every other text the value holds)."""
    leaf, cores, surrounding = draw(carried_credentials() | secret_pairs())
    key = draw(st.text(max_size=10))

    base = draw(json_values)
    return placed(draw, base, key, leaf), cores, json.dumps([base, key, *surrounding], ensure_ascii=False)


@settings(deadline=None, max_examples=500)
@given(case=placed_secrets())
def test_no_generated_secret_of_any_supported_shape_survives_scrub_json(case: tuple[Any, list[str], str]) -> None:
    value, cores, elsewhere = case
    stored = Redactor(max_bytes=1 << 20).scrub_json(value)
    for core in cores:
        if core not in elsewhere:
            assert core not in stored


# Pieces of text around the quick exit's tests: its triggers, case and Unicode variants of `bearer` and `basic`
# (a long s and a Kelvin sign fold to `s` and `k` in a case-insensitive regex, not in `str.lower`), a secret key.
_EXIT_PIECES = (
    *("=", ":", "://", "eyJ", "gh", "github_pat_", "xox", "sk-", "AKIA", "ASIA", "bst_", "PRIVATE KEY"),
    *("Bearer ", "BEARER ", "baſic ", "BASİC ", "Basic ", "\u212aey", "password", "token", " ", "x", "é", "\n"),
    *(GHP[:12], "A1b2C3d4E5f6G7h8", "dXNlcjpwYXNz", "QUtJQUlPU0ZPRE5ON0VYQU1QTEU="),
)


@settings(deadline=None, max_examples=400)
@given(text=st.lists(st.sampled_from(_EXIT_PIECES) | st.text(max_size=3), max_size=12).map("".join))
@example(text="password: x")
@example(text="token=x")
@example(text="Basic dXNlcjpwYXNz")
@example(text="BEARER A1b2C3d4E5f6G7h8")
def test_the_quick_exit_leaves_only_text_that_holds_nothing_to_redact(text: str) -> None:
    quick = redactor.redact_text(text)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr("bastion.ledger.redaction._holds_trigger", lambda text: True)  # every text the long way
        assert redactor.redact_text(text) == quick

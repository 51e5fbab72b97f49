"""The ledger's stored forms, computed the fast way, are exactly the reference ones: timestamps as
`isoformat` writes them in UTC, argument hashes as one HMAC-SHA256 call gives them. A hash or a timestamp that
changed form would break every stored chain and every waiting approval."""

from __future__ import annotations

import hmac
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from bastion.ledger.chain import stored_time
from bastion.ledger.keys import keyed_hash
from bastion.policies import canonical_json

_OFFSETS = st.none() | st.just(UTC) | st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
_MOMENTS = st.builds(
    lambda moment, tz: moment.replace(tzinfo=tz),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    _OFFSETS,
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def _reference_time(moment: datetime) -> str:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="microseconds")


@given(st.lists(_MOMENTS, min_size=1, max_size=4))
def test_stored_time_is_the_utc_isoformat_of_the_moment(moments: list[datetime]) -> None:
    for moment in [*moments, *moments]:  # again: from the kept ones, whichever form the same instant came in
        assert stored_time(moment) == _reference_time(moment)


def test_stored_time_keeps_naive_and_aware_moments_apart() -> None:
    # A naive moment is UTC; an aware one at +02:00 with the same wall time is two hours earlier.
    naive = datetime(2026, 11, 27, 12, 0, 0, 5)
    aware = naive.replace(tzinfo=timezone(timedelta(hours=2)))
    assert stored_time(naive) == "2026-11-27T12:00:00.000005+00:00"
    assert stored_time(aware) == "2026-11-27T10:00:00.000005+00:00"
    assert stored_time(naive) == "2026-11-27T12:00:00.000005+00:00"


@given(st.dictionaries(st.text(), _JSON, max_size=4), st.binary(min_size=32, max_size=32), st.binary(min_size=32))
def test_keyed_hash_is_hmac_sha256_of_the_canonical_arguments(
    arguments: dict[str, object], key: bytes, other: bytes
) -> None:
    for each in (key, other, key):  # one key's HMAC is never another's
        assert keyed_hash(each, arguments) == hmac.digest(each, canonical_json(arguments), "sha256").hex()

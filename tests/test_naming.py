"""Host-safe tool names."""

from __future__ import annotations

import re
from random import Random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.policies.naming import MAX_TOOL_NAME, NameRequest, assign_tool_names, sanitize, tool_name

HOST_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")

source_ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
namespaces = st.one_of(st.just(""), source_ids, st.text(max_size=30))
action_ids = st.text(min_size=1, max_size=80)


def test_tool_name_prefixes_the_namespace_with_a_double_underscore() -> None:
    assert tool_name("github", "create_issue") == "github__create_issue"


def test_empty_namespace_mounts_the_action_unprefixed() -> None:
    assert tool_name("", "get_time") == "get_time"


def test_sanitize_replaces_every_character_outside_the_host_alphabet() -> None:
    assert sanitize("a.b/c d:é-_Z9") == "a_b_c_d__-_Z9"


def test_tool_name_sanitises_namespace_and_action() -> None:
    assert tool_name("my.ns", "files/read") == "my_ns__files_read"


def test_tool_name_rejects_an_empty_action_id() -> None:
    with pytest.raises(ValueError, match="action_id"):
        tool_name("fs", "")


def test_a_name_of_exactly_the_cap_is_kept_whole() -> None:
    action = "a" * (MAX_TOOL_NAME - len("fs__"))
    assert tool_name("fs", action) == f"fs__{action}"


def test_a_long_name_is_cut_to_the_cap_and_ends_with_a_hash() -> None:
    name = tool_name("github", "x" * 100)
    assert len(name) == MAX_TOOL_NAME
    assert re.fullmatch(r"github__x+_[0-9a-f]{8}", name)


def test_long_names_sharing_a_prefix_stay_distinct() -> None:
    assert tool_name("fs", "a" * 60 + "one") != tool_name("fs", "a" * 60 + "two")


def test_long_names_that_sanitise_alike_stay_distinct() -> None:
    assert tool_name("fs", "a" * 60 + ".") != tool_name("fs", "a" * 60 + "/")


@given(namespaces, action_ids)
def test_tool_name_is_always_host_safe_capped_and_deterministic(namespace: str, action_id: str) -> None:
    name = tool_name(namespace, action_id)
    assert len(name) <= MAX_TOOL_NAME
    assert HOST_SAFE.fullmatch(name)
    assert tool_name(namespace, action_id) == name


def test_distinct_names_are_assigned_unchanged() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="fs", namespace="fs", action_id="read"),
            NameRequest(source_id="gh", namespace="gh", action_id="read"),
        ]
    )
    assert result.names == {("fs", "read"): "fs__read", ("gh", "read"): "gh__read"}
    assert result.warnings == []


def test_a_name_two_sources_claim_on_a_fresh_ledger_goes_to_neither() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="zeta", namespace="", action_id="search"),
            NameRequest(source_id="alpha", namespace="", action_id="search"),
        ]
    )
    assert result.names == {("alpha", "search"): "alpha__search", ("zeta", "search"): "zeta__search"}
    assert len(result.warnings) == 2


def test_a_collision_warning_names_the_other_claimant_and_the_new_name() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="b", namespace="shared", action_id="run"),
            NameRequest(source_id="a", namespace="shared", action_id="run"),
        ]
    )
    first, second = result.warnings
    assert "'shared__run'" in first and "b:run" in first and "a:run is listed as 'a__shared__run'" in first
    assert "a:run" in second and "b:run is listed as 'b__shared__run'" in second


def test_a_collision_within_one_source_after_sanitising_is_resolved() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="fs", namespace="fs", action_id="read.file"),
            NameRequest(source_id="fs", namespace="fs", action_id="read/file"),
        ]
    )
    first, second = result.names[("fs", "read.file")], result.names[("fs", "read/file")]
    assert first != second and "fs__read_file" not in (first, second)
    assert first.startswith("fs__fs__read_file_") and second.startswith("fs__fs__read_file_")
    assert len(result.warnings) == 2


def test_a_kept_name_stays_with_its_action_even_while_it_is_not_listed() -> None:
    kept = {"ops__read_status": ("ops", "read_status")}
    impostor = NameRequest(source_id="aaa", namespace="", action_id="ops__read_status")
    alone = assign_tool_names([impostor], kept)
    assert alone.names == {("aaa", "ops__read_status"): "aaa__ops__read_status"}
    [warning] = alone.warnings
    assert "given to ops:read_status, which keeps it" in warning

    both = assign_tool_names([impostor, NameRequest(source_id="ops", namespace="ops", action_id="read_status")], kept)
    assert both.names[("ops", "read_status")] == "ops__read_status"
    assert both.names[("aaa", "ops__read_status")] == "aaa__ops__read_status"


def test_an_action_renamed_before_gets_the_same_name_again() -> None:
    requests = [
        NameRequest(source_id="a", namespace="", action_id="x" * 60),
        NameRequest(source_id="b", namespace="", action_id="x" * 60),
    ]
    first = assign_tool_names(requests)
    kept = {name: key for key, name in first.names.items()}
    assert assign_tool_names(requests, kept).names == first.names
    assert assign_tool_names(requests[1:], kept).names == {("b", "x" * 60): first.names[("b", "x" * 60)]}


def test_a_renamed_action_never_takes_a_name_another_action_claims() -> None:
    first = assign_tool_names(
        [
            NameRequest(source_id="a", namespace="", action_id="x"),
            NameRequest(source_id="b", namespace="", action_id="x"),
        ]
    )
    stolen = first.names[("b", "x")]
    result = assign_tool_names(
        [
            NameRequest(source_id="a", namespace="", action_id="x"),
            NameRequest(source_id="b", namespace="", action_id="x"),
            NameRequest(source_id="c", namespace="", action_id=stolen),
        ]
    )
    assert result.names[("c", stolen)] == stolen
    assert result.names[("b", "x")] not in {"x", stolen}


def test_a_collision_between_long_names_stays_within_the_cap() -> None:
    action = "y" * 70
    result = assign_tool_names(
        [
            NameRequest(source_id="a", namespace="ns", action_id=action),
            NameRequest(source_id="b", namespace="ns", action_id=action),
        ]
    )
    names = [result.names[("a", action)], result.names[("b", action)]]
    assert len(set(names)) == 2 and tool_name("ns", action) not in names
    assert all(len(name) <= MAX_TOOL_NAME and HOST_SAFE.fullmatch(name) for name in names)


def test_duplicate_requests_for_one_action_are_refused() -> None:
    request = NameRequest(source_id="fs", namespace="fs", action_id="read")
    with pytest.raises(ValueError, match="fs:read"):
        assign_tool_names([request, request])


requests_lists = st.lists(
    st.builds(
        NameRequest,
        source_id=st.sampled_from(["a", "b", "c"]),
        namespace=st.sampled_from(["", "ns", "n.s", "n/s"]),
        action_id=st.one_of(st.sampled_from(["x", "x.y", "x/y", "x_y", "x" * 60]), action_ids),
    ),
    max_size=12,
    unique_by=lambda request: (request.source_id, request.action_id),
)


@given(requests_lists, st.randoms(use_true_random=False))
def test_assigned_names_are_unique_safe_and_independent_of_input_order(
    requests: list[NameRequest], random: Random
) -> None:
    result = assign_tool_names(requests)
    names = list(result.names.values())
    assert len(set(names)) == len(requests)
    assert all(len(name) <= MAX_TOOL_NAME and HOST_SAFE.fullmatch(name) for name in names)

    shuffled = list(requests)
    random.shuffle(shuffled)
    assert assign_tool_names(shuffled) == result


@given(requests_lists, requests_lists, st.randoms(use_true_random=False))
def test_a_kept_name_goes_only_to_its_action_and_names_stay_unique(
    earlier: list[NameRequest], now: list[NameRequest], random: Random
) -> None:
    kept = {name: key for key, name in assign_tool_names(earlier).names.items()}
    result = assign_tool_names(now, kept)
    assert len(set(result.names.values())) == len(now)
    for key, name in result.names.items():
        assert kept.get(name, key) == key, f"{name!r} was kept for {kept.get(name)}, not given to {key}"
    natural = {(r.source_id, r.action_id): tool_name(r.namespace, r.action_id) for r in now}
    for name, keeper in kept.items():
        if natural.get(keeper) == name:
            assert result.names[keeper] == name, "an action keeps the name it was given"

    shuffled = list(now)
    random.shuffle(shuffled)
    assert assign_tool_names(shuffled, kept) == result

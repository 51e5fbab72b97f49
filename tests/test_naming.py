"""Host-safe tool names (DESIGN.md §3)."""

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


def test_a_collision_across_sources_leaves_the_name_to_the_first_source_id() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="zeta", namespace="", action_id="search"),
            NameRequest(source_id="alpha", namespace="", action_id="search"),
        ]
    )
    assert result.names[("alpha", "search")] == "search"
    renamed = result.names[("zeta", "search")]
    assert re.fullmatch(r"search_[0-9a-f]{8}", renamed)
    assert len(result.warnings) == 1


def test_a_collision_warning_names_both_keys_and_both_names() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="b", namespace="shared", action_id="run"),
            NameRequest(source_id="a", namespace="shared", action_id="run"),
        ]
    )
    [warning] = result.warnings
    assert "a:run" in warning
    assert "b:run" in warning
    assert result.names[("a", "run")] in warning
    assert result.names[("b", "run")] in warning


def test_a_collision_within_one_source_after_sanitising_is_resolved() -> None:
    result = assign_tool_names(
        [
            NameRequest(source_id="fs", namespace="fs", action_id="read.file"),
            NameRequest(source_id="fs", namespace="fs", action_id="read/file"),
        ]
    )
    # "read.file" sorts before "read/file", so it keeps the sanitised name.
    assert result.names[("fs", "read.file")] == "fs__read_file"
    assert result.names[("fs", "read/file")] != "fs__read_file"
    assert result.names[("fs", "read/file")].startswith("fs__read_file_")
    [warning] = result.warnings
    assert "fs:read.file" in warning
    assert "fs:read/file" in warning


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
    assert result.names[("a", action)] == tool_name("ns", action)
    renamed = result.names[("b", action)]
    assert renamed != result.names[("a", action)]
    assert len(renamed) == MAX_TOOL_NAME
    assert HOST_SAFE.fullmatch(renamed)


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

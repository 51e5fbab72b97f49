"""Argument-level policy conditions: `[[rules]]` with CEL conditions, compiled at load (problems with
file and line), judged on each call's arguments with a cost limit, and never relaxing when they fail."""

from __future__ import annotations

import re
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from bastion.config import Config, load_config
from bastion.config.conditions import COST_LIMIT, Conditions, compile_condition, normpath
from bastion.config.strict_cel import json_type
from bastion.ledger import Redactor, open_ledger
from bastion.models import MODES, RISKS, CallContext, Mode, ModeDecision, PolicyRule, Risk
from bastion.pipeline.gateway import Gateway
from bastion.policies.modes import MODE_STRICTNESS, resolve_mode
from bastion.server.mcp import HostServer
from tests.test_gateway import error_of
from tests.test_sources import Counter

pytestmark = pytest.mark.anyio

POLICY = """
[modes]
"counter:add" = "require_approval"

[[rules]]
key = "counter:add"
when = "args.n > 100"
mode = "deny"

[[rules]]
key = "counter:add"
when = "args.n <= 10"
mode = "allow"

[[rules]]
key = "counter:*"
when = 'args.label.startsWith("public/")'
mode = "allow"

[[profiles.careful.rules]]
key = "counter:add"
when = "args.n > 1"
mode = "deny"
"""


def write_policy(tmp_path: Path, text: str) -> Path:
    (tmp_path / "policies").mkdir(parents=True, exist_ok=True)
    (tmp_path / "policies" / "default.toml").write_text(textwrap.dedent(text))
    return tmp_path


@asynccontextmanager
async def counter_gateway(config: Config, tmp_path: Path) -> AsyncIterator[tuple[Client, Gateway]]:
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [Counter()])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield client, gateway


def test_rules_load_from_policy_files_in_the_order_written(tmp_path: Path) -> None:
    config = load_config(write_policy(tmp_path, POLICY))
    assert not config.issues
    assert [(r.key, r.mode) for r in config.policy.rules] == [
        ("counter:add", "deny"),
        ("counter:add", "allow"),
        ("counter:*", "allow"),
    ]
    assert [r.when for r in config.policy.profiles["careful"].rules] == ["args.n > 1"]


def test_a_broken_rule_is_reported_with_file_and_line_and_only_ever_resolves_stricter(tmp_path: Path) -> None:
    text = """
    [[rules]]
    key = "counter:add"
    when = 'args.n >'
    mode = "allow"

    [[rules]]
    key = "counter add"
    when = "true"
    mode = "alow"
    """
    config = load_config(write_policy(tmp_path, text))
    lines = textwrap.dedent(text).splitlines()
    reported = {(issue.line, lines[issue.line - 1].split("=")[0].strip()) for issue in config.issues}
    assert reported == {(4, "when"), (8, "key"), (10, "mode")}
    assert all(issue.file == tmp_path / "policies" / "default.toml" for issue in config.issues)
    conditions = Conditions(config.policy.rules)
    decision = resolve_mode(
        source_id="counter",
        action_id="add",
        risk="write",
        profile_modes=None,
        org_modes={},
        org_rules=config.policy.rules,
        judge=lambda rule: conditions.holds(rule, {"n": 1}),
    )
    # The broken rule would allow; undecided, it gives the stricter of that and the inferred require_approval.
    assert decision == ModeDecision(mode="require_approval", source="condition_failed:counter:add")


async def test_conditions_on_the_arguments_choose_the_mode_of_a_call(tmp_path: Path) -> None:
    config = load_config(write_policy(tmp_path / "config", POLICY))
    async with counter_gateway(config, tmp_path) as (client, gateway):
        entry = gateway.catalog.get("counter__add")
        assert entry is not None
        context = CallContext(session_id="s")

        def mode(**arguments: object) -> ModeDecision:
            return gateway.mode_of(entry, context, arguments=arguments)

        assert mode(n=5) == ModeDecision(mode="allow", source="org_rule")
        assert mode(n=500) == ModeDecision(mode="deny", source="org_rule")
        assert mode(n=50) == ModeDecision(mode="require_approval", source="org")
        assert mode(n=50, label="public/x") == ModeDecision(mode="require_approval", source="org")
        assert gateway.mode_of(entry, CallContext(session_id="s", profile="careful"), arguments={"n": 5}).mode == "deny"
        # Without arguments (the catalog) a rule is undecided: the strictest it could give is shown.
        assert gateway.mode_of(entry, context) == ModeDecision(mode="deny", source="conditional:counter:add")

        allowed = await client.call_tool("counter__add", {"n": 5})
        assert not allowed.is_error
        denied = await client.call_tool("counter__add", {"n": 500})
        assert error_of(denied)["class"] == "policy_denied"
        statuses = {i.args["n"]: (i.status, i.mode_source) for i in await gateway.invocations.list() if i.args}
        assert statuses == {5: ("completed", "org_rule"), 500: ("denied", "org_rule")}


async def test_a_condition_that_fails_on_a_call_resolves_to_the_stricter_mode(tmp_path: Path) -> None:
    policy = """
    [[rules]]
    key = "counter:read"
    when = 'args.path.startsWith("/srv/public/")'
    mode = "allow"
    [[rules]]
    key = "counter:reset"
    when = 'args.path.startsWith("/srv/public/")'
    mode = "allow"
    """
    config = load_config(write_policy(tmp_path / "config", policy))
    async with counter_gateway(config, tmp_path) as (_, gateway):
        read, reset = gateway.catalog.get("counter__read"), gateway.catalog.get("counter__reset")
        assert read is not None
        assert reset is not None
        context = CallContext(session_id="s")
        # No `path`: the condition fails; read's inferred allow and the rule's allow agree.
        assert gateway.mode_of(read, context, arguments={}).mode == "allow"
        # reset is danger (inferred deny): a failing "allow" rule must not open it.
        failed = gateway.mode_of(reset, context, arguments={"path": 3})
        assert failed == ModeDecision(mode="deny", source="condition_failed:counter:reset")
        assert gateway.mode_of(reset, context, arguments={"path": "/srv/public/a"}).mode == "allow"


def test_a_condition_over_its_cost_limit_is_not_evaluated() -> None:
    rule = PolicyRule(key="fs:write", when="args.items.all(x, args.items.all(y, x + y > 0))", mode="allow")
    conditions = Conditions([rule])
    assert conditions.holds(rule, {"items": [1, 2, 3]}) is True
    many = list(range(1, 2000))
    assert compile_condition(rule.when).cost({"items": many}) > COST_LIMIT
    assert conditions.holds(rule, {"items": many}) is None


def test_a_condition_that_does_not_give_a_boolean_is_undecided() -> None:
    rule = PolicyRule(key="fs:write", when="args.n + 1", mode="allow")
    assert Conditions([rule]).holds(rule, {"n": 1}) is None


# -- property tests: a failing condition never relaxes

keys = st.sampled_from(["fs:write", "fs:*", "fs:read", "git:*"])
modes = st.sampled_from([*MODES, "alow"])
rules = st.lists(st.builds(PolicyRule, key=keys, when=st.just("c"), mode=modes), max_size=5)
mode_maps = st.dictionaries(keys, modes, max_size=3)


def _strictness(mode: Mode) -> int:
    return MODE_STRICTNESS[mode]


@settings(deadline=None, max_examples=300)
@given(
    profile_modes=st.one_of(st.none(), mode_maps),
    org_modes=mode_maps,
    profile_rules=rules,
    org_rules=rules,
    risk=st.sampled_from(RISKS),
    verdicts=st.lists(st.sampled_from([True, False, None]), min_size=10, max_size=10),
    failing=st.integers(min_value=0, max_value=9),
)
def test_a_failing_condition_is_never_less_strict_than_either_outcome_of_it(
    profile_modes: dict[str, str] | None,
    org_modes: dict[str, str],
    profile_rules: list[PolicyRule],
    org_rules: list[PolicyRule],
    risk: Risk,
    verdicts: list[bool | None],
    failing: int,
) -> None:
    every = [*profile_rules, *org_rules]

    def resolve(override: bool | None) -> Mode:
        def judge(rule: PolicyRule) -> bool | None:
            index = next(i for i, r in enumerate(every) if r is rule)
            return override if index == failing else verdicts[index]

        return resolve_mode(
            source_id="fs",
            action_id="write",
            risk=risk,
            profile_modes=profile_modes,
            org_modes=org_modes,
            profile_rules=profile_rules,
            org_rules=org_rules,
            judge=judge,
        ).mode

    failed = resolve(None)
    assert _strictness(failed) >= _strictness(resolve(True))
    assert _strictness(failed) >= _strictness(resolve(False))


@settings(deadline=None, max_examples=300)
@given(org_modes=mode_maps, org_rules=rules, risk=st.sampled_from(RISKS))
def test_without_arguments_the_mode_shown_is_the_strictest_any_call_could_get(
    org_modes: dict[str, str], org_rules: list[PolicyRule], risk: Risk
) -> None:
    def resolve(judge: object) -> Mode:
        return resolve_mode(
            source_id="fs",
            action_id="write",
            risk=risk,
            profile_modes=None,
            org_modes=org_modes,
            org_rules=org_rules,
            judge=judge,  # type: ignore[arg-type]
        ).mode

    shown = resolve(None)
    for holds in (True, False):
        assert _strictness(shown) >= _strictness(resolve(lambda _rule, holds=holds: holds))


def _readme_policy() -> str:
    """The documented example policy with rules (the `# policies/default.toml` block of docs/policy.md)."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "policy.md").read_text()
    blocks = re.findall(r"```toml\n(# policies/default.toml\n.*?)```", readme, flags=re.DOTALL)
    (block,) = [str(block) for block in blocks if "[[rules]]" in block]
    return block


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        ("/srv/public/notes.txt", "allow"),
        ("/srv/public/a/./b//c.txt", "allow"),
        ("/srv/public/../../etc/passwd", "require_approval"),
        ("/srv/public/..//..//etc/shadow", "require_approval"),
        ("/srv/public/.env", "deny"),
        ("/srv/public/x/../.env", "deny"),
        ("../outside.txt", "deny"),
        ("/etc/passwd", "require_approval"),
    ],
)
def test_the_readme_example_never_allows_a_path_that_walks_out_of_its_prefix(
    tmp_path: Path, path: str, mode: Mode
) -> None:
    config = load_config(write_policy(tmp_path, _readme_policy()))
    assert not config.issues, config.issues
    conditions = Conditions(config.policy.rules)
    decision = resolve_mode(
        source_id="fs",
        action_id="write_file",
        risk="danger",
        profile_modes=None,
        org_modes=config.policy.modes,
        org_rules=config.policy.rules,
        judge=lambda rule: conditions.holds(rule, {"path": path, "content": "x"}),
    )
    assert decision.mode == mode


def test_a_rule_testing_a_raw_prefix_of_a_path_is_reported_with_the_fix(tmp_path: Path) -> None:
    text = """
    [[rules]]
    key = "fs:write_file"
    when = 'args.path.startsWith("/srv/public/") || args.target_dir.startsWith("/tmp/")'
    mode = "allow"
    """
    config = load_config(write_policy(tmp_path, text))
    messages = [issue.message for issue in config.issues]
    assert len(messages) == 2 and all("normpath(args." in message for message in messages)
    assert all(issue.line == 4 for issue in config.issues)
    clean = "[[rules]]\nkey = 'fs:write_file'\nwhen = 'normpath(args.path).startsWith(\"/srv/\")'\nmode = 'allow'\n"
    assert not load_config(write_policy(tmp_path / "clean", clean)).issues


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "/", "//", ".env"]), max_size=8))
def test_a_normalised_path_has_no_dot_segments_or_repeated_slashes_but_a_leading_climb(parts: list[str]) -> None:
    path = "/".join(parts)
    normal = normpath(path)
    assert "//" not in normal
    segments = normal.split("/")
    assert "." not in segments or normal == "."
    climbing = [i for i, segment in enumerate(segments) if segment == ".."]
    assert climbing == list(range(len(climbing)))  # `..` only at the start of a relative path
    assert not (normal.startswith("/") and climbing)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _same_kinds(a: object, b: object) -> bool:
    """Whether two JSON values have one type all the way down (where an equality would look)."""
    if json_type(a) != json_type(b):
        return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) != len(b) or all(_same_kinds(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() != b.keys() or all(_same_kinds(a[k], b[k]) for k in a)
    return True


@settings(max_examples=300, deadline=None)
@given(a=json_values, b=json_values, operator=st.sampled_from(["==", "!="]))
def test_equality_across_json_types_is_undecided_and_within_one_type_is_json_equality(
    a: object, b: object, operator: str
) -> None:
    rule = PolicyRule(key="fx:echo", when=f"args.a {operator} args.b", mode="deny")
    verdict = Conditions([rule]).holds(rule, {"a": a, "b": b})
    if not _same_kinds(a, b):
        assert verdict is None  # undecided: the stricter mode applies
    else:
        assert verdict is ((a == b) if operator == "==" else (a != b))


@settings(max_examples=200, deadline=None)
@given(item=json_scalars, container=st.one_of(st.lists(json_scalars, max_size=4), json_scalars))
def test_membership_needs_every_element_of_the_items_type(item: object, container: object) -> None:
    rule = PolicyRule(key="fx:echo", when="args.item in args.container", mode="deny")
    verdict = Conditions([rule]).holds(rule, {"item": item, "container": container})
    if isinstance(container, list) and all(json_type(element) == json_type(item) for element in container):
        assert verdict is (item in container)
    else:
        assert verdict is None


def _judged(rule: PolicyRule, sent: dict[str, object]) -> ModeDecision:
    """The mode of a write action whose one rule is `rule`, on the arguments `sent`."""
    conditions = Conditions([rule])
    source_id, action_id = rule.key.split(":")
    return resolve_mode(
        source_id=source_id,
        action_id=action_id,
        risk="write",
        profile_modes=None,
        org_modes={},
        org_rules=[rule],
        judge=lambda r: conditions.holds(r, sent),
    )


@pytest.mark.parametrize(
    ("when", "sent", "mode"),
    [
        ("args.n == 5", {"n": "5"}, "deny"),  # deny rule: undecided is the stricter mode, deny
        ('args.env == "prod"', {"env": ["prod"]}, "deny"),
        ("args.force == true", {"force": "true"}, "deny"),
        ('args.env in ["prod", "staging"]', {"env": ["prod"]}, "deny"),
    ],
)
def test_a_deny_rule_comparing_across_types_still_denies(when: str, sent: dict[str, object], mode: str) -> None:
    assert _judged(PolicyRule(key="fx:echo", when=when, mode="deny"), sent).mode == mode


def test_an_allow_rule_with_unequal_across_types_does_not_open_a_write_tool() -> None:
    rule = PolicyRule(key="fx:write", when='args.env != "prod"', mode="allow")
    assert _judged(rule, {"env": ["prod"]}).mode == "require_approval"  # CEL says true: the allow would open it

"""Two-person approval in policy: `[approvers]` by policy key, risk tier, profile or rule rides along with the
resolved mode; the tiers R3 and R4 stay apart after loading (both `danger`), so a policy can ask two approvers of
R4 only; a bad `approvers` value is reported naming the fix, and denies the calls it names until fixed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import mcp_types as types

from bastion.config import ConnectorConfig, load_config
from bastion.models import PolicyRule
from bastion.policies import resolve_mode
from bastion.sources.mcp.specs import action_specs


def tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object"})


def _resolve(risk: str = "write", **policy: object) -> tuple[str, str, int]:
    decision = resolve_mode(
        source_id="fs",
        action_id="delete_file",
        risk=risk,  # type: ignore[arg-type]
        profile_modes=None,
        org_modes={},
        **policy,  # type: ignore[arg-type]
    )
    return decision.mode, decision.source, decision.approvers


def test_approvers_on_a_key_a_source_or_a_rule_ride_along_with_a_held_call() -> None:
    assert _resolve(org_approvers={"fs:delete_file": 2}) == ("require_approval", "inferred", 2)
    assert _resolve(profile_approvers={"fs:*": 2}) == ("require_approval", "inferred", 2)
    rule = PolicyRule(key="fs:delete_file", when="true", mode="require_approval", approvers=2)
    assert _resolve(org_rules=[rule], judge=lambda _: True) == ("require_approval", "org_rule", 2)
    assert _resolve(org_rules=[rule], judge=lambda _: False) == ("require_approval", "inferred", 1)
    assert _resolve() == ("require_approval", "inferred", 1)


def test_approvers_never_turn_an_allowed_or_denied_call_into_a_held_one() -> None:
    assert _resolve("read", org_approvers={"fs:delete_file": 2}) == ("allow", "inferred", 1)
    assert _resolve("danger", org_approvers={"fs:delete_file": 2}) == ("deny", "inferred", 1)


def test_a_tier_is_matched_on_its_own_so_r4_alone_needs_two_approvers() -> None:
    counts = {"R4": 2}
    modes = {"fs:*": "require_approval"}
    r4 = resolve_mode(source_id="fs", action_id="x", risk="danger", profile_modes=None, org_modes=modes,
                      org_approvers=counts, tier="R4")  # fmt: skip
    r3 = resolve_mode(source_id="fs", action_id="x", risk="danger", profile_modes=None, org_modes=modes,
                      org_approvers=counts, tier="R3")  # fmt: skip
    assert (r4.approvers, r3.approvers) == (2, 1)


def test_a_connectors_r3_and_r4_tools_keep_their_tiers_after_loading() -> None:
    config = ConnectorConfig.model_validate(
        {"id": "fs", "command": "x", "default_risk": "R3", "tools": {"rm_rf": {"risk": "r4"}, "ls": {"risk": "read"}}}
    )
    specs = {spec.action_id: spec for spec in action_specs(config, [tool("rm_rf"), tool("mv"), tool("ls")])}
    assert {name: (spec.risk, spec.tier) for name, spec in specs.items()} == {
        "rm_rf": ("danger", "R4"),
        "mv": ("danger", "R3"),
        "ls": ("read", None),
    }


def _load(tmp_path: Path, policy: str) -> tuple[object, list[tuple[int, str]]]:
    root = tmp_path.resolve() / "config"
    (root / "policies").mkdir(parents=True)
    path = root / "policies" / "default.toml"
    path.write_text(textwrap.dedent(policy).removeprefix("\n"), encoding="utf-8")
    config = load_config(root, env={}, home=root / "home")
    return config.policy, [(issue.line, issue.message) for issue in config.issues if issue.file == path]


def test_approvers_load_from_a_policy_file_by_key_tier_profile_and_rule(tmp_path: Path) -> None:
    policy, issues = _load(
        tmp_path,
        """
        [approvers]
        "fs:delete_file" = 2
        R4 = 2
        [profiles.nightly.approvers]
        "github:*" = 2
        [[rules]]
        key = "fs:write_file"
        when = "args.path == '/etc/passwd'"
        mode = "require_approval"
        approvers = 2
        """,
    )
    assert issues == []
    assert policy.approvers == {"fs:delete_file": 2, "R4": 2}  # type: ignore[attr-defined]
    assert policy.profiles["nightly"].approvers == {"github:*": 2}  # type: ignore[attr-defined]
    assert policy.rules[0].approvers == 2  # type: ignore[attr-defined]


def test_a_bad_approvers_value_is_reported_with_its_fix_and_denies_its_calls(tmp_path: Path) -> None:
    policy, issues = _load(
        tmp_path,
        """
        [approvers]
        "fs:delete_file" = "two"
        "fs:move" = 0
        fs = 2
        [[rules]]
        key = "fs:write_file"
        when = "true"
        mode = "allow"
        approvers = 2
        """,
    )
    lines = dict(issues)
    assert "is not a number of approvers; write 2 (two distinct approvers" in lines[2]
    assert "Until then its calls are denied" in lines[2]
    assert "not a number of approvers" in lines[3]
    assert 'key "fs" is not a policy key or a risk tier' in lines[4]
    assert 'set mode = "require_approval" or remove approvers' in lines[9]
    counts = policy.approvers  # type: ignore[attr-defined]
    decision = resolve_mode(
        source_id="fs", action_id="delete_file", risk="write", profile_modes=None, org_modes={}, org_approvers=counts
    )
    assert (decision.mode, decision.source) == ("deny", "invalid_approvers:fs:delete_file")

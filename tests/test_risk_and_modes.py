"""Risk derivation and mode resolution."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bastion.models import MODES, RISKS, Grant, GrantScope, Mode, ModeDecision, PolicyRule, Risk, RiskDecision
from bastion.policies.modes import MODE_STRICTNESS, is_mode, resolve_mode, stricter
from bastion.policies.risk import derive_risk, normalize_risk
from tests.ledger_contract.samples import T0

risks = st.sampled_from(RISKS)
modes = st.sampled_from(MODES)
hints = st.sampled_from([None, True, False])


@pytest.mark.parametrize("value", ["read", "write", "danger", "READ", "Danger"])
def test_normalize_risk_accepts_the_three_risks_in_any_case(value: str) -> None:
    assert normalize_risk(value) == value.lower()


@pytest.mark.parametrize(
    ("alias", "risk"),
    [("R0", "read"), ("R1", "read"), ("R2", "write"), ("R3", "danger"), ("R4", "danger"), ("r3", "danger")],
)
def test_normalize_risk_accepts_seed_000_tiers(alias: str, risk: Risk) -> None:
    assert normalize_risk(alias) == risk


@pytest.mark.parametrize("value", ["", "R5", "high", "reads", " read"])
def test_normalize_risk_refuses_anything_else_and_names_the_accepted_values(value: str) -> None:
    with pytest.raises(ValueError, match="read, write, danger, R0") as error:
        normalize_risk(value)
    assert repr(value) in str(error.value)


def test_risk_override_wins_over_every_hint_and_says_so() -> None:
    decision = derive_risk(override="read", read_only_hint=False, destructive_hint=True, default_risk="danger")
    assert decision == RiskDecision(risk="read", source="override")


def test_destructive_hint_gives_danger_even_when_read_only_hint_is_set() -> None:
    decision = derive_risk(override=None, read_only_hint=True, destructive_hint=True, default_risk="read")
    assert decision == RiskDecision(risk="danger", source="destructiveHint")


def test_read_only_hint_gives_read_over_the_default_risk() -> None:
    decision = derive_risk(override=None, read_only_hint=True, destructive_hint=False, default_risk="danger")
    assert decision == RiskDecision(risk="read", source="readOnlyHint")


def test_false_hints_fall_through_to_the_connectors_default_risk() -> None:
    decision = derive_risk(override=None, read_only_hint=False, destructive_hint=False, default_risk="danger")
    assert decision == RiskDecision(risk="danger", source="default_risk")


def test_risk_falls_back_to_write_by_default() -> None:
    decision = derive_risk(override=None, read_only_hint=None, destructive_hint=None, default_risk=None)
    assert decision == RiskDecision(risk="write", source="default")


@given(st.one_of(st.none(), risks), hints, hints, st.one_of(st.none(), risks))
def test_derived_risk_is_the_override_whenever_one_is_set(
    override: Risk | None, read_only: bool | None, destructive: bool | None, default: Risk | None
) -> None:
    decision = derive_risk(
        override=override, read_only_hint=read_only, destructive_hint=destructive, default_risk=default
    )
    assert decision.risk in RISKS
    if override is not None:
        assert decision == RiskDecision(risk=override, source="override")


@pytest.mark.parametrize(("value", "expected"), [("allow", True), ("deny", True), ("Allow", False), ("yes", False)])
def test_is_mode_accepts_exactly_the_three_modes(value: str, expected: bool) -> None:
    assert is_mode(value) is expected


def test_stricter_orders_allow_below_require_approval_below_deny() -> None:
    assert MODE_STRICTNESS["allow"] < MODE_STRICTNESS["require_approval"] < MODE_STRICTNESS["deny"]
    assert stricter("allow", "require_approval") == "require_approval"
    assert stricter("deny", "require_approval") == "deny"
    assert stricter("allow", "allow") == "allow"


@given(modes, modes)
def test_stricter_returns_one_of_its_arguments_and_is_symmetric(a: Mode, b: Mode) -> None:
    assert stricter(a, b) in {a, b}
    assert stricter(a, b) == stricter(b, a)
    assert MODE_STRICTNESS[stricter(a, b)] >= max(MODE_STRICTNESS[a], MODE_STRICTNESS[b])


def _resolve(
    profile: dict[str, str] | None, org: dict[str, str], risk: Risk = "write", action: str = "write_file"
) -> ModeDecision:
    return resolve_mode(source_id="fs", action_id=action, risk=risk, profile_modes=profile, org_modes=org)


def test_profile_exact_key_wins_over_everything() -> None:
    decision = _resolve(
        {"fs:write_file": "deny", "fs:*": "allow"},
        {"fs:write_file": "allow", "fs:*": "allow"},
    )
    assert decision == ModeDecision(mode="deny", source="profile")


def test_profile_wildcard_wins_over_the_org_map() -> None:
    decision = _resolve({"fs:*": "require_approval"}, {"fs:write_file": "allow"})
    assert decision == ModeDecision(mode="require_approval", source="profile")


def test_org_exact_key_wins_over_the_org_wildcard() -> None:
    decision = _resolve({"fs:other": "deny"}, {"fs:write_file": "allow", "fs:*": "deny"})
    assert decision == ModeDecision(mode="allow", source="org")


def test_org_wildcard_wins_over_inference() -> None:
    decision = _resolve(None, {"fs:*": "allow"}, risk="danger")
    assert decision == ModeDecision(mode="allow", source="org")


def test_a_wildcard_of_another_source_does_not_match() -> None:
    decision = _resolve({"github:*": "deny"}, {"github:*": "deny"}, risk="read")
    assert decision == ModeDecision(mode="allow", source="inferred")


@pytest.mark.parametrize(("risk", "mode"), [("read", "allow"), ("write", "require_approval"), ("danger", "deny")])
def test_mode_is_inferred_from_risk_when_no_map_matches(risk: Risk, mode: Mode) -> None:
    assert _resolve({}, {}, risk=risk) == ModeDecision(mode=mode, source="inferred")


def test_an_unknown_mode_in_the_profile_map_denies() -> None:
    decision = _resolve({"fs:write_file": "alow"}, {"fs:write_file": "allow"}, risk="read")
    assert decision == ModeDecision(mode="deny", source="unknown_mode:alow")


def test_an_unknown_mode_in_the_org_map_denies() -> None:
    decision = _resolve(None, {"fs:*": "ALLOW"}, risk="read")
    assert decision == ModeDecision(mode="deny", source="unknown_mode:ALLOW")


policy_maps = st.dictionaries(
    st.sampled_from(["fs:write_file", "fs:*", "fs:other", "gh:*"]),
    st.one_of(modes, st.text(max_size=20)),
    max_size=4,
)


@given(st.one_of(st.none(), policy_maps), policy_maps, risks)
def test_resolved_mode_is_always_a_mode_with_a_known_source(
    profile: dict[str, str] | None, org: dict[str, str], risk: Risk
) -> None:
    decision = _resolve(profile, org, risk=risk)
    assert decision.mode in MODES
    assert decision.source in {"profile", "org", "inferred"} or decision.source.startswith("unknown_mode:")


@given(st.one_of(st.none(), policy_maps), policy_maps, risks)
def test_an_unknown_mode_value_never_yields_allow(
    profile: dict[str, str] | None, org: dict[str, str], risk: Risk
) -> None:
    decision = _resolve(profile, org, risk=risk)
    if decision.source.startswith("unknown_mode:"):
        assert decision.mode == "deny"
        assert not is_mode(decision.source.removeprefix("unknown_mode:"))


# -- standing grants beside the operator's rules

policy_rules = st.lists(
    st.builds(
        PolicyRule,
        key=st.sampled_from(["fs:write_file", "fs:*", "fs:other"]),
        when=st.sampled_from(["a", "b", "c"]),
        mode=st.one_of(modes, st.just("ALLOW")),
    ),
    max_size=4,
)
verdicts = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.booleans()))


def standing(scope: GrantScope) -> Grant:
    """A grant of `scope` on fs:write_file, as an approval leaves it."""
    return Grant(id=f"{scope}_0123456789ab", policy_key="fs:write_file", scope=scope, grantor="alice", created_at=T0)


@given(
    profile=st.one_of(st.none(), policy_maps),
    org=policy_maps,
    profile_rules=policy_rules,
    org_rules=policy_rules,
    held=verdicts,
    risk=risks,
    grant=st.sampled_from([None, "session", "hour", "always"]),
)
def test_no_grant_makes_a_call_run_that_an_operator_entry_denies_and_it_only_ever_lifts_a_hold(
    profile: dict[str, str] | None,
    org: dict[str, str],
    profile_rules: list[PolicyRule],
    org_rules: list[PolicyRule],
    held: dict[str, bool | None],
    risk: Risk,
    grant: GrantScope | None,
) -> None:
    def resolve(grant: Grant | None) -> ModeDecision:
        return resolve_mode(
            source_id="fs",
            action_id="write_file",
            risk=risk,
            profile_modes=profile,
            org_modes=org,
            profile_rules=profile_rules,
            org_rules=org_rules,
            judge=lambda rule: held.get(rule.when),
            grant=grant,
        )

    operator, granted = resolve(None), resolve(None if grant is None else standing(grant))
    if granted != operator:
        assert (operator.mode, granted.mode, granted.source) == (
            "require_approval",
            "allow",
            f"grant:{grant}_0123456789ab",
        )
        matching = [*(profile or {}).items(), *org.items()]
        denying = [v for k, v in matching if k in ("fs:write_file", "fs:*") and (not is_mode(v) or v == "deny")]
        denying += [
            r.mode
            for r in [*profile_rules, *org_rules]
            if r.key in ("fs:write_file", "fs:*") and held.get(r.when) is not False and r.mode != "allow"
            and r.mode != "require_approval"
        ]  # fmt: skip
        assert not denying  # no matching operator entry says deny, even one the first match shadows


def test_an_always_grant_lifts_the_org_hold_but_not_a_wildcard_rule_that_denies_the_arguments() -> None:
    dots = PolicyRule(key="fs:*", when="dots", mode="deny")
    org = {"fs:write_file": "require_approval"}

    def resolve(has_dots: bool) -> ModeDecision:
        return resolve_mode(
            source_id="fs",
            action_id="write_file",
            risk="write",
            profile_modes=None,
            org_modes=org,
            org_rules=[dots],
            judge=lambda rule: has_dots,
            grant=standing("always"),
        )

    assert resolve(False) == ModeDecision(mode="allow", source="grant:always_0123456789ab")
    assert resolve(True) == ModeDecision(mode="require_approval", source="org")  # the operator's first match


def test_an_always_grant_leaves_a_profiles_hold_and_a_rules_hold_where_a_session_grant_lifts_only_the_first() -> None:
    on_etc = PolicyRule(key="fs:write_file", when="etc", mode="require_approval")

    def resolve(grant: GrantScope, *, profile: dict[str, str] | None, rules: list[PolicyRule]) -> ModeDecision:
        return resolve_mode(
            source_id="fs",
            action_id="write_file",
            risk="write",
            profile_modes=profile,
            org_modes={},
            org_rules=rules,
            judge=lambda rule: True,
            grant=standing(grant),
        )

    profile = {"fs:*": "require_approval"}
    assert resolve("always", profile=profile, rules=[]).source == "profile"
    for scope in ("session", "hour"):
        assert resolve(scope, profile=profile, rules=[]) == ModeDecision(
            mode="allow", source=f"grant:{scope}_0123456789ab"
        )
        assert resolve(scope, profile=None, rules=[on_etc]).source == "org_rule"
    assert resolve("always", profile=None, rules=[on_etc]).source == "org_rule"

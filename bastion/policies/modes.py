"""Mode resolution: what actually happens to a call, and which rule decided it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Final, TypeGuard

from bastion.models import MODES, Grant, Mode, ModeDecision, PolicyRule, Risk, Tier, policy_key

MODE_STRICTNESS: Final[dict[Mode, int]] = {"allow": 0, "require_approval": 1, "deny": 2}
"""Higher is stricter; policy layers may only move a call up this order."""

_INFERRED: Final[dict[Risk, Mode]] = {"read": "allow", "write": "require_approval", "danger": "deny"}

GRANT_LIFTS: Final[dict[str, frozenset[str]]] = {
    "session": frozenset({"profile", "org", "inferred"}),
    "hour": frozenset({"profile", "org", "inferred"}),
    "always": frozenset({"org", "inferred"}),
}
"""For each scope of a standing grant, the mode sources of a `require_approval` it lifts: a key's plain mode (an
"always" grant, made for every session, not a profile's, which its sessions chose to be stricter) or the risk's
default. A call held by a rule on its arguments, an undecided condition, drift or a declared floor stays held."""
LIFTABLE: Final = frozenset().union(*GRANT_LIFTS.values())
"""The mode sources of a `require_approval` some grant could lift: only such a call needs its grants looked up."""


def is_mode(value: object) -> TypeGuard[Mode]:
    """Whether `value` is exactly one of `allow`, `require_approval`, `deny`."""
    return isinstance(value, str) and value in MODES


def strictness(value: str) -> float:
    """How strict a configured mode value is: a value that is not a mode ranks just below `deny`, since it
    resolves to deny (a merge that keeps the stricter value then keeps a real `deny` over a typo)."""
    return MODE_STRICTNESS[value] if is_mode(value) else MODE_STRICTNESS["deny"] - 0.5


def stricter(a: Mode, b: Mode) -> Mode:
    """The stricter of two modes."""
    return a if MODE_STRICTNESS[a] >= MODE_STRICTNESS[b] else b


RuleJudge = Callable[[PolicyRule], bool | None]
"""Whether a rule's condition holds for the call being resolved; None when it is undecided (it failed to evaluate,
or there are no arguments to judge it on)."""


def resolve_mode(
    *,
    source_id: str,
    action_id: str,
    risk: Risk,
    profile_modes: Mapping[str, str] | None,
    org_modes: Mapping[str, str],
    profile_rules: Sequence[PolicyRule] = (),
    org_rules: Sequence[PolicyRule] = (),
    judge: RuleJudge | None = None,
    undecided: str = "condition_failed",
    grant: Grant | None = None,
    profile_approvers: Mapping[str, int] | None = None,
    org_approvers: Mapping[str, int] | None = None,
    tier: Tier | None = None,
) -> ModeDecision:
    """The mode of one action, first match wins: profile `source:action`, profile `source:*`, org (same keys),
    then inferred from risk. For each key, its rules (conditional modes) are tried first, in order: the first whose
    condition holds decides (source `profile_rule` or `org_rule`); when none does, the key's plain mode applies, if
    it has one.

    A matched value that is not a mode gives `deny` (source `unknown_mode:<value>`): a typo in a policy
    file must never open a door. A rule whose condition is undecided (`judge` gives None, or there is no `judge`)
    gives the stricter of its own mode and what resolution gives without it (source `<undecided>:<key>`): a
    condition that fails never relaxes.

    `grant` is the approvers' standing grant that covers this call, if any. It sits beside the operator's rules,
    never among them: they decide first, and the grant then turns a `require_approval` its scope lifts
    (`GRANT_LIFTS`: a key's plain mode, or the risk's default) into `allow`, with mode source `grant:<its id>`,
    unless any operator entry that matches the call says `deny` (a wildcard, a
    profile's, a rule whose condition holds or is undecided, a value that is not a mode), even one the first match
    shadows. No grant undoes a deny, and none lifts what a rule on the arguments holds.

    A call held for approval carries how many distinct approvers it needs (`approvers`, see `required_approvers`);
    no grant lifts a call that needs more than one.
    """
    keys = (policy_key(source_id, action_id), policy_key(source_id, "*"))
    candidates: list[tuple[str, str, PolicyRule | None]] = []
    for source, modes, rules in (("profile", profile_modes or {}, profile_rules), ("org", org_modes, org_rules)):
        for key in keys:
            candidates.extend((f"{source}_rule", rule.mode, rule) for rule in rules if rule.key == key)
            if key in modes:
                candidates.append((source, modes[key], None))
    decision = _first_match(candidates, 0, risk, judge, undecided)
    maps = (profile_approvers or {}, org_approvers or {})
    approvers = required_approvers((*keys, *((tier,) if tier else ())), maps, candidates, judge)
    if approvers < 1:  # a value that was not a number of approvers: never fewer than the operator meant
        return ModeDecision(mode="deny", source=f"invalid_approvers:{keys[0]}")
    if decision.mode == "require_approval" and approvers > 1:
        return decision.model_copy(update={"approvers": approvers})
    if grant is None or decision.mode != "require_approval" or decision.source not in GRANT_LIFTS[grant.scope]:
        return decision
    if any(_may_deny(value, rule, judge) for _, value, rule in candidates):
        return decision
    return ModeDecision(mode="allow", source=f"grant:{grant.id}")


def required_approvers(
    keys: Sequence[str],
    maps: Sequence[Mapping[str, int]],
    candidates: Sequence[tuple[str, str, PolicyRule | None]],
    judge: RuleJudge | None,
) -> int:
    """How many distinct approvers a held call needs: the most that any entry for it asks (`[approvers]` of the
    profile or the organisation by its policy key, its source's `source:*` or its risk tier, and every rule of its
    keys whose condition holds or is undecided), at least one. More approvers is stricter, so the most wins, as the
    stricter mode does. 0 when an entry for it is invalid (see bastion.config.approvers): its calls are denied."""
    counts = [count for approvers in maps for key in keys if (count := approvers.get(key)) is not None]
    counts += [
        rule.approvers
        for _, _, rule in candidates
        if rule is not None and rule.approvers is not None and (judge is None or judge(rule) is not False)
    ]
    return 0 if any(count < 1 for count in counts) else max([1, *counts])


def _may_deny(value: str, rule: PolicyRule | None, judge: RuleJudge | None) -> bool:
    """Whether an operator entry denies the call being resolved (a rule: unless its condition surely fails)."""
    if is_mode(value) and value != "deny":
        return False
    return rule is None or judge is None or judge(rule) is not False


def _first_match(
    candidates: Sequence[tuple[str, str, PolicyRule | None]],
    start: int,
    risk: Risk,
    judge: RuleJudge | None,
    undecided: str,
) -> ModeDecision:
    for i in range(start, len(candidates)):
        source, value, rule = candidates[i]
        verdict = True if rule is None else judge(rule) if judge is not None else None
        if verdict is False:
            continue
        own = _decision(value, source) if is_mode(value) else _decision("deny", f"unknown_mode:{value}")
        if verdict is True:
            return own
        assert rule is not None
        rest = _first_match(candidates, i + 1, risk, judge, undecided)
        return ModeDecision(mode=stricter(own.mode, rest.mode), source=f"{undecided}:{rule.key}")
    return _decision(_INFERRED[risk], "inferred")


@functools.lru_cache(maxsize=256)
def _decision(mode: Mode, source: str) -> ModeDecision:
    """One decision per mode and source, shared (it is frozen): building the model costs a call more than looking it
    up."""
    return ModeDecision(mode=mode, source=source)


OPERATOR_SOURCES: Final = frozenset({"org", "profile", "org_rule", "profile_rule"})
"""The mode sources that are an operator's own entry for an action (a key's mode, or a rule whose condition held):
not the risk's default, an undecided condition, drift, or an approver's grant."""


def covers_held_steps(own: ModeDecision) -> bool:
    """Whether a composite allowed by `own` may run steps that policy holds for an approver without asking one: only
    when an operator's own entry for the composite allows it."""
    return own.mode == "allow" and own.source in OPERATOR_SOURCES


def compose_mode(
    own: ModeDecision,
    *,
    approval_required: bool,
    steps: Sequence[tuple[str, ModeDecision, bool]],
    held_steps: Sequence[str] = (),
) -> ModeDecision:
    """The mode of a composite action (a manifest action) from its own and its steps' (policy key, mode, drifted),
    decided before any step runs.

    A composite is never looser than its steps: a step that policy denies denies it (source `step:<key>`), and a
    drifted step holds it for an approver (source `drift:<key>`), who then sees which step changed. A declared
    `approval_required` holds it too (source `declared`, or `declared:<key>` for a step's). A step that needs an
    approver holds it (source `step:<key>`), unless an operator's own entry for the composite allows it
    (`covers_held_steps`): the risk's default or an approver's grant never does. The composite's approval then
    covers its steps.
    """
    if own.mode == "deny":
        return own
    for key, step, _ in steps:
        if step.mode == "deny":
            return ModeDecision(mode="deny", source=f"step:{key}")
    if own.mode != "allow":
        return own
    drifted = next((key for key, _, step_drifted in steps if step_drifted), None)
    if drifted is not None:
        return ModeDecision(mode="require_approval", source=f"drift:{drifted}")
    if approval_required:
        return ModeDecision(mode="require_approval", source="declared")
    if held_steps:
        return ModeDecision(mode="require_approval", source=f"declared:{held_steps[0]}")
    if covers_held_steps(own):
        return own
    held = next((key for key, step, _ in steps if step.mode == "require_approval"), None)
    if held is not None:
        return ModeDecision(mode="require_approval", source=f"step:{held}")
    return own

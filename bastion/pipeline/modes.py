"""What mode each call gets (allow, require_approval, deny): the operator's policy for the action's risk, its
rules judged on the arguments, a composite's steps, the drift guard, and the standing grants that may lift a hold.
The rules themselves are pure functions in `bastion.policies`; this puts them together with the gateway's pins,
listings and grants."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from bastion.config import Config
from bastion.config.conditions import Conditions
from bastion.models import CallContext, Grant, ModeDecision, Risk, utcnow
from bastion.pipeline.catalog import CatalogEntry
from bastion.pipeline.grants import Grants
from bastion.pipeline.listings import Listings
from bastion.pipeline.pinning import Pins
from bastion.policies import LIFTABLE, compose_mode, guard_drift, resolve_mode


class Modes:
    """The mode of every action for every call, as the gateway's policy, pins, listings and grants give it."""

    def __init__(self, config: Config, listings: Listings, pins: Pins, grants: Grants) -> None:
        self.config = config
        self.conditions = Conditions(
            [*config.policy.rules, *(r for p in config.policy.profiles.values() for r in p.rules)]
        )
        """The policy rules' conditions, compiled once."""
        self.listings = listings
        self.pins = pins
        self.grants = grants

    def of(
        self,
        entry: CatalogEntry,
        context: CallContext,
        *,
        drifted: bool | None = None,
        arguments: Mapping[str, Any] | None = None,
        grant: Grant | None = None,
    ) -> ModeDecision:
        """The mode of one action for one session; a drifted one is judged by the drift guard (`guard_drift`).

        Policy rules with conditions are judged on `arguments`; without them (a listing, the catalog) a rule is
        undecided, so the mode shown is the strictest the rule could give (source `conditional:<key>`). `grant`:
        the standing grant that covers the call, if any (see `granted`); a listing shows operator policy."""
        if drifted is None:
            drifted = self.pins.drift(entry.source_id, entry.action_id) is not None
        current = self.compose(entry, context, self._resolve(entry, entry.action.risk, context, arguments, grant))
        if not drifted:
            return current
        if self.listings.drift_listing(entry.action) == "hide":
            return ModeDecision(mode="deny", source="drift")
        trusted = self.pins.pinned_definition(entry.source_id, entry.action_id)
        if trusted is None:
            return needing(guard_drift(current, None), current.approvers)
        pinned_risk = self.listings.sources[entry.source_id].risk_of(entry.action_id, trusted)
        pinned = self._resolve(entry, pinned_risk, context, arguments, grant)
        return needing(guard_drift(current, pinned), max(current.approvers, pinned.approvers))

    async def granted(
        self,
        entry: CatalogEntry,
        context: CallContext,
        decision: ModeDecision,
        *,
        drifted: bool,
        arguments: Mapping[str, Any],
    ) -> ModeDecision:
        """`decision`, or, when it holds the call in a way a grant can lift and a standing grant covers the call,
        the mode with that grant (`allow`, mode source `grant:<id>`, unless an operator rule still says otherwise).
        Only a call that would wait for an approver asks the ledger."""
        if decision.mode != "require_approval" or decision.source not in LIFTABLE or decision.approvers > 1:
            return decision
        grant = await self.grants.covering(
            entry.key, session_id=context.session_id, principal=context.principal, arguments=arguments, now=utcnow()
        )
        if grant is None:
            return decision
        return self.of(entry, context, drifted=drifted, arguments=arguments, grant=grant)

    def _resolve(
        self,
        entry: CatalogEntry,
        risk: Risk,
        context: CallContext,
        arguments: Mapping[str, Any] | None,
        grant: Grant | None,
    ) -> ModeDecision:
        if self.config.unreadable_policies:  # a policy file that cannot be read fails closed
            return ModeDecision(mode="deny", source=f"unreadable_policy:{self.config.unreadable_policies[0]}")
        policy = self.config.policy
        profile = policy.profiles.get(context.profile) if context.profile else None
        judge = None if arguments is None else partial(self.conditions.holds, arguments=arguments)
        return resolve_mode(
            source_id=entry.source_id,
            action_id=entry.action_id,
            risk=risk,
            profile_modes=profile.modes if profile else None,
            org_modes=policy.modes,
            profile_rules=profile.rules if profile else (),
            org_rules=policy.rules,
            judge=judge,
            undecided="conditional" if arguments is None else "condition_failed",
            grant=grant,
            profile_approvers=profile.approvers if profile else None,
            org_approvers=policy.approvers,
            tier=entry.action.spec.tier,
        )

    def compose(self, entry: CatalogEntry, context: CallContext, own: ModeDecision) -> ModeDecision:
        """The mode of `entry` given its own resolved mode: for a composite, tightened by its steps (see
        `compose_mode`: never looser than its steps, decided before any runs); any other action's is `own`."""
        spec = entry.action.spec
        if not spec.steps and not spec.approval_required:
            return own
        steps = []
        held: list[str] = []
        for source_id, action_id in spec.steps:
            step = self.listings.lookup(source_id, action_id)
            if step is None:
                continue  # not offered now: the composite is unavailable, and refused if called
            drifted = self.pins.drift(source_id, action_id) is not None
            steps.append((step.key, self.of(step, context, drifted=drifted), drifted))
            if step.action.spec.approval_required:
                held.append(step.key)
        composed = compose_mode(own, approval_required=spec.approval_required, steps=steps, held_steps=held)
        return needing(composed, max([own.approvers, *(step.approvers for _, step, _ in steps)]))


def needing(decision: ModeDecision, approvers: int) -> ModeDecision:
    """`decision`, needing at least `approvers` distinct approvers if it holds the call: a layer that tightens a mode
    (drift, a composite's steps) keeps how many approvers the policy asked for."""
    if decision.mode != "require_approval" or approvers <= decision.approvers:
        return decision
    return decision.model_copy(update={"approvers": approvers})

"""The merged catalog: every source's actions under host-safe names.

A source's action specs are prepared once when its listing changes (definition, fingerprints); naming
runs over all sources together because collisions are resolved across them. What hosts list of an action is
its tool, except for a drifted one: until an approver accepts the new definition, the gateway
may list the pinned (trusted) one instead, or nothing (`listed_tool`), since a changed description is itself
a way to steer the agent.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from bastion.actions import ActionSpec, DriftListing
from bastion.errors import InvalidArguments
from bastion.models import CallContext, Invocation, ModeDecision, Risk, policy_key, utcnow
from bastion.policies import Fingerprints, NameRequest, assign_tool_names, fingerprints
from bastion.schemas import SchemaCheck

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedAction:
    """One action's spec with what the pipeline derives from it once per listing: its wire-form
    definition and fingerprints."""

    source_id: str
    spec: ActionSpec
    definition: dict[str, Any]
    """The upstream definition in wire form (camelCase), as fingerprinted."""
    fingerprints: Fingerprints

    @property
    def action_id(self) -> str:
        return self.spec.action_id

    @property
    def upstream(self) -> types.Tool:
        return self.spec.tool

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    @property
    def risk(self) -> Risk:
        return self.spec.risk

    @property
    def risk_source(self) -> str:
        return self.spec.risk_source

    @property
    def hidden(self) -> bool:
        return self.spec.hidden


@dataclass(slots=True)
class CatalogEntry:
    """An action as the host sees it: its host-facing name and tool, and its policy facts."""

    name: str
    action: PreparedAction
    tool: types.Tool
    """What `tools/list` shows under `name`: the upstream tool, or the pinned definition of a drifted one."""
    listed: bool = True
    """False for a drifted action that hosts do not see until it is accepted (it may still be called)."""
    _arguments: SchemaCheck | None = field(default=None, repr=False)

    @property
    def source_id(self) -> str:
        return self.action.source_id

    @property
    def action_id(self) -> str:
        return self.action.action_id

    @property
    def key(self) -> str:
        return policy_key(self.action.source_id, self.action.action_id)

    def new_invocation(
        self,
        arguments: dict[str, Any],
        args_hash: str,
        decision: ModeDecision,
        context: CallContext,
        *,
        owner: str,
        drift: list[str] | None,
        parent_id: str | None = None,
    ) -> Invocation:
        """A call of this action as it is first recorded: `executing` (the pipeline's checks then hold or refuse
        it), under a new id, owned by the instance `owner`."""
        now = utcnow()
        return Invocation(
            id=new_invocation_id(),
            status="executing",
            policy_key=self.key,
            tool=self.name,
            source_id=self.source_id,
            action_id=self.action_id,
            risk=self.action.risk,
            risk_source=self.action.risk_source,
            mode=decision.mode,
            mode_source=decision.source,
            fingerprint=self.action.fingerprints.full,
            session_id=context.session_id,
            profile=context.profile,
            principal=context.principal,
            args=arguments,
            args_hash=args_hash,
            owner=owner,
            drift=drift,
            parent_id=parent_id,
            created_at=now,
            updated_at=now,
        )

    def validate_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Check arguments against the upstream input schema; raise InvalidArguments naming the problem."""
        if self._arguments is None:
            self._arguments = SchemaCheck(self.action.upstream.input_schema)
        error = self._arguments.error(arguments)
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(root)"
            fix = "send arguments that match the tool's inputSchema"
            if self.tool.input_schema != self.action.upstream.input_schema:
                fix = (
                    "the tool's inputSchema changed since it was trusted, and hosts are shown the new one only "
                    "once an approver accepts it"
                )
            raise InvalidArguments(f"invalid arguments for {self.name} at {where}: {error.message}; {fix}")


def prepare_actions(source_id: str, specs: Sequence[ActionSpec]) -> list[PreparedAction]:
    """Wire-form definitions and fingerprints of one source's actions."""
    prepared = []
    for spec in specs:
        definition = spec.tool.model_dump(by_alias=True, mode="json", exclude_none=True)
        prepared.append(PreparedAction(source_id, spec, definition, fingerprints(definition)))
    return prepared


def listed_tool(
    action: PreparedAction, *, drifted: bool, listing: DriftListing, trusted: Mapping[str, Any] | None
) -> types.Tool | None:
    """What hosts list of an action (under its own name): its tool; for a drifted one, by `listing`, its current
    tool, its trusted definition (`pinned`; nothing when there is none: a new tool held for approval, or one
    pinned by fingerprint in a connector file), or nothing (`hide`)."""
    if not drifted or listing == "current":
        return action.upstream
    if listing == "hide" or trusted is None:
        return None
    try:
        return types.Tool.model_validate(trusted)
    except ValidationError:
        logger.warning("the pinned definition of %s is not a valid tool; it is not listed", action.action_id)
        return None


Lister = Callable[[PreparedAction], types.Tool | None]
"""What hosts list of an action (under its own name), or None when they do not see it (see `listed_tool`)."""


class Catalog:
    """Host names to entries, plus the ready-made `tools/list` answer."""

    def __init__(
        self,
        actions: Iterable[PreparedAction] = (),
        lister: Lister | None = None,
        kept: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """`kept`: the host names given before (name -> source_id, action_id), which stay with their actions."""
        by_key = {(a.source_id, a.action_id): a for a in actions}
        assignment = assign_tool_names(
            (NameRequest(source_id=a.source_id, namespace=a.namespace, action_id=a.action_id) for a in by_key.values()),
            kept,
        )
        self.warnings = assignment.warnings
        """The name collisions resolved, each saying who lists under which name."""
        for warning in assignment.warnings:
            logger.warning("%s", warning)
        self.entries: dict[str, CatalogEntry] = {}
        self.by_action: dict[tuple[str, str], CatalogEntry] = {}
        """The same entries by (source_id, action_id)."""
        for key, name in sorted(assignment.names.items(), key=lambda item: item[1]):
            action = by_key[key]
            shown = lister(action) if lister is not None else action.upstream
            tool = shown if shown is not None else action.upstream
            if tool.name != name:
                tool = tool.model_copy(update={"name": name})
            entry = CatalogEntry(name=name, action=action, tool=tool, listed=shown is not None)
            self.entries[name] = self.by_action[key] = entry
        self.tools: list[types.Tool] = [e.tool for e in self.entries.values() if e.listed and not e.action.hidden]

    def get(self, name: str) -> CatalogEntry | None:
        return self.entries.get(name)


def new_invocation_id() -> str:
    """A short id that sorts by creation time: 12 hex digits of milliseconds, then 12 random ones."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"

"""Plugin action packages as a source of the catalog: source id and namespace `plugins`, one action per package.

The gates a package cannot bypass are declared to the pipeline, not kept here alone: an R3/R4 action carries
`approval_required` (a floor `mode_of` honours whatever the policy says), and its scope is the spec's `admit`
check, made before the call is recorded. The scope is checked again right before `execute` runs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types

from bastion.actions import ActionSpec
from bastion.errors import ConnectorUnavailable, PolicyDenied, UpstreamError
from bastion.models import PLUGIN_SOURCE_ID, Invocation, Preview, Risk, SourceStatus
from bastion.policies import declared_risk
from bastion.sources.plugins.flow import TERMINAL_STATUSES, StepLimits, run_flow, run_plan, run_rollback
from bastion.sources.plugins.package import PluginPackage
from bastion.sources.plugins.scope import scope_violation
from bastion.sources.seam import ChangeFn, ProgressFn

_SECTION = {"type": "object", "properties": {"attempted": {"type": "boolean"}, "ok": {"type": "boolean"}}}


def envelope_schema(output_schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The output schema of a plugin tool: the plugin result envelope, its `output` the package's outputSchema."""
    return {
        "type": "object",
        "properties": {
            "status": {"enum": list(TERMINAL_STATUSES)},
            "actionType": {"type": "string"},
            "riskTier": {"type": "string"},
            "output": dict(output_schema) if output_schema else {"type": "object"},
            "verification": {"type": "object", "properties": {"ok": {"type": "boolean"}, "checks": {"type": "array"}}},
            "repair": _SECTION,
            "rollback": _SECTION,
            "feedback": {"type": "object"},
        },
        "required": ["status", "actionType", "riskTier", "verification", "repair", "rollback"],
    }


class PluginSource:
    """The loaded packages, run in child processes under `limits`; ready once started (nothing to connect)."""

    def __init__(self, packages: Sequence[PluginPackage], limits: StepLimits) -> None:
        self._packages = {package.name: package for package in packages}
        self._limits = limits
        self._up = False
        self._specs = [self._spec(package) for package in packages]

    @property
    def source_id(self) -> str:
        return PLUGIN_SOURCE_ID

    @property
    def namespace(self) -> str:
        return PLUGIN_SOURCE_ID

    @property
    def status(self) -> SourceStatus:
        if not self._limits.workspace.is_dir():
            return SourceStatus(
                source_id=PLUGIN_SOURCE_ID,
                state="unavailable",
                last_error=f"the plugin workspace {self._limits.workspace} is not a directory; create it or set "
                "[plugins] workspace in bastion.toml",
            )
        if not self._up:
            return SourceStatus(source_id=PLUGIN_SOURCE_ID, state="starting")
        return SourceStatus(source_id=PLUGIN_SOURCE_ID, state="ready", tools=len(self._specs))

    def actions(self) -> list[ActionSpec]:
        return list(self._specs) if self._up and self._limits.workspace.is_dir() else []

    def risk_of(self, action_id: str, definition: Mapping[str, Any]) -> Risk:
        """The risk `definition` (e.g. the pinned one) carries: a package's declared risk is in its tool's
        annotations, so lowering it is drift and does not loosen its mode."""
        return declared_risk(definition)

    async def run(self, on_change: ChangeFn) -> None:
        self._up = True
        try:
            await on_change(PLUGIN_SOURCE_ID)
            await anyio.sleep_forever()
        finally:
            self._up = False

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        on_progress: ProgressFn | None = None,
        relay: object | None = None,
    ) -> types.CallToolResult:
        """Run the package's flow; a result with `isError` unless it `succeeded`. Each step has its own timeout
        (`[plugins] timeout_seconds`), so the call's `timeout` does not cut the flow short (a cut rollback would
        leave the workspace in a state nobody knows)."""
        package = self._packages.get(action_id)
        if package is None or not self._up:
            raise ConnectorUnavailable(f"plugin {action_id!r} is not loaded; nothing ran")
        violation = scope_violation(package.action.scope, self._limits.workspace, arguments)
        if violation is not None:
            raise PolicyDenied(f"{PLUGIN_SOURCE_ID}:{action_id} refused before it ran: {violation}")
        state = self.state_dir(correlation_id)
        state.mkdir(parents=True, exist_ok=True)
        finished = False
        try:
            envelope = await run_flow(
                package, arguments, correlation_id=correlation_id, limits=self._limits, state_dir=state
            )
            finished = True
        finally:
            if finished:  # an interrupted call keeps its state: its rollback may still need it
                shutil.rmtree(state, ignore_errors=True)
        summary = f"{PLUGIN_SOURCE_ID}:{action_id} {envelope['status']}"
        if envelope["feedback"]:
            summary += f": {envelope['feedback']['reason']}"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=summary + "\n" + json.dumps(envelope, ensure_ascii=False))],
            structured_content=envelope,
            is_error=envelope["status"] != "succeeded",
        )

    def state_dir(self, correlation_id: str) -> Path:
        """The state directory of the call with this correlation id (its invocation id)."""
        return self._limits.state / correlation_id

    async def roll_back(self, action_id: str, arguments: dict[str, Any], *, correlation_id: str) -> dict[str, Any]:
        """Run the rollback step of a call whose outcome is unknown, with its state directory; the step's report.
        ConnectorUnavailable when the package is not loaded or has no rollback."""
        package = self._packages.get(action_id)
        if package is None or "rollback" not in package.executables:
            raise ConnectorUnavailable(f"plugin {action_id!r} is not loaded, or has no rollback step; nothing ran")
        state = self.state_dir(correlation_id)
        state.mkdir(parents=True, exist_ok=True)
        report = await run_rollback(
            package, arguments, correlation_id=correlation_id, limits=self._limits, state_dir=state
        )
        if report["ok"]:
            shutil.rmtree(state, ignore_errors=True)
        return report

    async def preview(self, action_id: str, invocation: Invocation, arguments: dict[str, Any]) -> Preview:
        """The package's `plan` step (its dry run) for a call about to be held: its `summary` and `text` if it wrote
        them, else its whole output. UpstreamError when the step failed; its state directory is removed after."""
        package = self._packages.get(action_id)
        if package is None or not self._up:
            raise ConnectorUnavailable(f"plugin {action_id!r} is not loaded")
        state = self.state_dir(f"{invocation.id}.plan")
        state.mkdir(parents=True, exist_ok=True)
        try:
            run = await run_plan(package, arguments, correlation_id=invocation.id, limits=self._limits, state_dir=state)
        finally:
            shutil.rmtree(state, ignore_errors=True)
        if not run.ok:
            tail = f": {run.stderr.splitlines()[-1]}" if run.stderr.strip() else ""
            raise UpstreamError(f"{PLUGIN_SOURCE_ID}:{action_id}'s plan step failed ({run.error}){tail}")
        output = run.output or {}
        summary, text = output.get("summary"), output.get("text")
        if not isinstance(summary, str):
            summary = f"{PLUGIN_SOURCE_ID}:{action_id}'s plan"
        if not isinstance(text, str):
            text = json.dumps(output, indent=2, ensure_ascii=False, sort_keys=True)
        return Preview(kind="plan", summary=summary, text=text)

    def _spec(self, package: PluginPackage) -> ActionSpec:
        action = package.action
        danger = package.needs_approver
        tool = types.Tool(
            name=package.name,
            title=action.title,
            description=action.description or f"Plugin action {package.name} ({action.risk_tier}).",
            input_schema=action.input_schema,
            output_schema=envelope_schema(action.output_schema),
            annotations=types.ToolAnnotations(read_only_hint=package.risk == "read", destructive_hint=danger or None),
        )
        scope = action.scope
        admit = partial(scope_violation, scope, self._limits.workspace) if scope.path_arguments else None
        preview = partial(self.preview, package.name) if "plan" in package.executables else None
        return ActionSpec(
            tool=tool,
            risk=package.risk,
            tier=package.action.risk_tier,
            namespace=PLUGIN_SOURCE_ID,
            approval_required=danger,
            admit=admit,
            preview=preview,
        )

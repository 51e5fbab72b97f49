"""Manifest actions as a source: every loaded `actions/*.md` file is one action of the source `actions`.

An action is listed while it is enabled (the overlay of `bastion actions enable|disable`) and available: every
source it requires is ready, matches the version and content hash the manifest pins (if it pins them), and
offers the actions its steps call. Its risk is the highest of its declared risk and its steps' risks, so it
never looks safer than what it runs; the gateway resolves its mode like any action's (`actions:<name>`), which
its steps then tighten (see `bastion.policies.compose_mode`).

A call checks every step against the manifest's capabilities before anything runs, then runs the steps in order
through the gateway's step runner, each a child invocation of the manifest's. The first failure stops the chain
with that step's error class; the steps that finished are not undone, and the error says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import anyio
import mcp_types as types

from bastion.actions import ActionSpec, PreviewFn
from bastion.errors import (
    BastionError,
    ConfigError,
    ConnectorUnavailable,
    InvalidArguments,
    NotFound,
    UpstreamError,
)
from bastion.models import MANIFEST_SOURCE_ID, RISK_ALIASES, RISKS, Risk, SourceState, SourceStatus
from bastion.policies import canonical_json, declared_risk
from bastion.sources.manifests import ActionState, Manifest, Step, TemplateError, render
from bastion.sources.manifests.preview import composite_preview
from bastion.sources.seam import ChangeFn, HostRequest, ProgressFn, StepRunner

logger = logging.getLogger(__name__)

POLL_SECONDS: Final = 1.0
"""How often the enabled overlay is looked at for changes made by `bastion actions enable|disable`."""


def connector_hash(status: SourceStatus, actions: Collection[ActionSpec]) -> str:
    """The content hash a manifest pins a connector by: SHA-256 of the canonical JSON of its server info (name,
    version) and the definitions of all its tools, as the upstream sends them (hidden ones included)."""
    tools = sorted(
        (spec.tool.model_dump(by_alias=True, mode="json", exclude_none=True) for spec in actions),
        key=lambda tool: str(tool.get("name")),
    )
    content = {"server": {"name": status.server_name, "version": status.server_version}, "tools": tools}
    return "sha256:" + hashlib.sha256(canonical_json(content)).hexdigest()


@dataclass(frozen=True)
class ManifestView:
    """One manifest action as `bastion actions list|show` shows it: whether it is enabled, and if not available,
    why; its risk once its steps are known; the current version and content hash of each source it requires."""

    manifest: Manifest
    enabled: bool
    reason: str | None
    """Why it is unavailable (None: it is available)."""
    risk: Risk | None
    versions: dict[str, str | None] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    risk_source: str = "declared"
    """Where its risk came from: its file (`declared`), or its riskiest step above that (`step:<key>`)."""

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def listed(self) -> bool:
        return self.enabled and self.reason is None


class ManifestSource:
    """The manifest actions of one configuration, run through the gateway's step runner (see `bind`)."""

    def __init__(
        self, manifests: Sequence[Manifest], state: ActionState, *, poll_seconds: float = POLL_SECONDS
    ) -> None:
        self._manifests = {m.name: m for m in manifests}
        self._state = state
        self._poll = poll_seconds
        self._steps: StepRunner | None = None
        self._views: dict[str, ManifestView] = {}
        self._specs: dict[str, ActionSpec] = {}
        self._source_state: SourceState = "starting"
        self._changed = anyio.Event()
        self._enabled: dict[str, bool] = {}
        self._state_error: str | None = None
        self._stamp: tuple[int, int] | None = None
        self._overlay_read = False

    @property
    def source_id(self) -> str:
        return MANIFEST_SOURCE_ID

    @property
    def namespace(self) -> str:
        return MANIFEST_SOURCE_ID

    @property
    def status(self) -> SourceStatus:
        unavailable = [v for v in self._views.values() if v.enabled and v.reason is not None]
        last_error = (
            f"{len(unavailable)} unavailable: {unavailable[0].name}: {unavailable[0].reason}" if unavailable else None
        )
        return SourceStatus(
            source_id=self.source_id, state=self._source_state, tools=len(self._specs), last_error=last_error
        )

    def bind(self, steps: StepRunner) -> None:
        self._steps = steps
        self._changed.set()

    def observe(self, source_id: str) -> None:
        if any(m.requirement(source_id) for m in self._manifests.values()):
            self._changed.set()

    def actions(self) -> list[ActionSpec]:
        return list(self._specs.values())

    def views(self) -> list[ManifestView]:
        """Every loaded manifest action, listed or not, by name."""
        return sorted(self._views.values(), key=lambda view: view.name)

    def risk_of(self, action_id: str, definition: Mapping[str, Any]) -> Risk:
        """The risk `definition` (e.g. the pinned one) carries: a manifest's risk, from its file and its steps, is
        in its tool's annotations, so an edit that lowers it is drift and does not loosen its mode."""
        return declared_risk(definition)

    def refusal(self, name: str) -> BastionError | None:
        prefix = f"{self.namespace}__"
        view = self._views.get(name.removeprefix(prefix)) if name.startswith(prefix) else None
        return None if view is None else _refusal(view, self._state_error)

    async def run(self, on_change: ChangeFn) -> None:
        """Evaluate every manifest whenever a source it requires changes or the overlay is rewritten, and announce
        the listing when that changes anything."""
        last: object = None
        while True:
            self._evaluate()
            snapshot = (self._source_state, self._views)
            if snapshot != last:
                last = snapshot
                await on_change(self.source_id)
            while True:
                with anyio.move_on_after(self._poll):
                    await self._changed.wait()
                if self._changed.is_set() or self._state.stamp() != self._stamp:
                    break
            self._changed = anyio.Event()

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        on_progress: ProgressFn | None = None,
        relay: HostRequest | None = None,
    ) -> types.CallToolResult:
        """Run a manifest action for invocation `correlation_id`: check, then its steps in order (see the module)."""
        view = self._views.get(action_id)
        if view is None:
            raise NotFound(f"no manifest action {action_id!r}")
        refusal = _refusal(view, self._state_error)
        if refusal is not None or self._steps is None:
            raise refusal or ConnectorUnavailable("manifest actions run only inside a gateway")
        manifest = view.manifest
        manifest.enforce_capabilities()
        scope: dict[str, Any] = {"args": manifest.arguments(arguments)}
        done: list[tuple[Step, str]] = []
        last: types.CallToolResult | None = None
        for number, step in enumerate(manifest.front.execute, start=1):
            try:
                inputs = render(step.inputs, scope)
            except TemplateError as exc:
                raise _stopped(manifest, step, InvalidArguments(str(exc)), done) from exc
            try:
                child, last = await self._steps.run_step(
                    correlation_id,
                    step_id=step.id,
                    source_id=step.source,
                    action_id=step.action,
                    arguments=inputs,
                    relay=relay,
                )
            except BastionError as exc:
                raise _stopped(manifest, step, exc, done) from exc
            if last.is_error:
                raise _stopped(manifest, step, UpstreamError(_text(last), invocation_id=child), done)
            scope[step.id] = output_of(last)
            done.append((step, child))
            if on_progress is not None:
                await on_progress(number, len(manifest.front.execute), f"step {step.id} ({step.key}) completed")
        assert last is not None  # a manifest has at least one step
        return _result(manifest, done, scope, last)

    # -- evaluation -----------------------------------------------------------------------------------

    def _evaluate(self) -> None:
        self._read_overlay()
        views: dict[str, ManifestView] = {}
        specs: dict[str, ActionSpec] = {}
        settled = self._steps is not None and not self._dependencies_starting()
        for name, manifest in self._manifests.items():
            view = self._view(manifest)
            before = self._views.get(name)
            changed = before is None or before.reason != view.reason
            if settled and view.enabled and view.reason is not None and changed:
                logger.warning("manifest action %s is unavailable: %s", name, view.reason)
            views[name] = view
            if view.listed and view.risk is not None:
                assert self._steps is not None  # listed only once bound
                specs[name] = _spec(
                    manifest, view.risk, view.risk_source, partial(composite_preview, manifest, self._steps)
                )
        self._views, self._specs = views, specs
        if settled:
            self._source_state = "ready"

    def _read_overlay(self) -> None:
        stamp = self._state.stamp()
        if self._overlay_read and stamp == self._stamp:
            return
        self._stamp, self._overlay_read = stamp, True
        try:
            self._enabled, self._state_error = self._state.read(), None
        except ConfigError as exc:
            if self._state_error != exc.message:
                logger.error("%s", exc.message)
            self._enabled, self._state_error = {}, exc.message

    def _dependencies_starting(self) -> bool:
        assert self._steps is not None
        required = {r.id for m in self._manifests.values() for r in m.front.requires.connectors}
        sources = [self._steps.source(source_id) for source_id in required]
        return any(source is not None and source.status.state == "starting" for source in sources)

    def _view(self, manifest: Manifest) -> ManifestView:
        enabled = self._state_error is None and self._enabled.get(manifest.name, True)
        if self._steps is None:
            return ManifestView(manifest, enabled, "manifest actions run only inside a gateway", None)
        reasons: list[str] = []
        versions: dict[str, str | None] = {}
        hashes: dict[str, str] = {}
        offered: dict[str, dict[str, ActionSpec]] = {}
        for requirement in manifest.front.requires.connectors:
            source = self._steps.source(requirement.id)
            where = manifest.where(f"requires:{requirement.id}")
            if source is None:
                reasons.append(f"source {requirement.id!r} is not configured, or is disabled by policy ({where})")
                continue
            status = source.status
            if status.state != "ready":
                why = f": {status.last_error}" if status.last_error else ""
                reasons.append(f"source {requirement.id!r} is {status.state}{why}")
                continue
            actions = source.actions()
            offered[requirement.id] = {spec.action_id: spec for spec in actions}
            versions[requirement.id] = status.server_version
            hashes[requirement.id] = current = connector_hash(status, actions)
            reasons.extend(_pin_mismatches(manifest, requirement.id, status, current, where))
        risks: list[tuple[Risk, str]] = [(manifest.front.risk, "declared")]
        for step in manifest.front.execute:
            spec = offered.get(step.source, {}).get(step.action)
            if step.source not in offered:
                continue  # the source's own reason is given above
            if spec is None:
                reasons.append(f"step {step.id!r}: source {step.source!r} offers no action {step.action!r}")
            elif spec.hidden:
                reasons.append(f"step {step.id!r}: {step.key} is hidden by its connector file, so no one may call it")
            else:
                risks.append((spec.risk, f"step:{step.key}"))
        # The first of the riskiest: the file's own risk when a step only matches it.
        risk, risk_source = max(risks, key=lambda pair: RISKS.index(pair[0]))
        return ManifestView(
            manifest, enabled, "; ".join(reasons) or None, None if reasons else risk, versions, hashes, risk_source
        )


def _pin_mismatches(manifest: Manifest, source_id: str, status: SourceStatus, current: str, where: str) -> list[str]:
    requirement = manifest.requirement(source_id)
    assert requirement is not None
    found = []
    if requirement.version is not None and status.server_version != requirement.version:
        found.append(
            f"source {source_id!r} runs version {status.server_version or '(none reported)'} but the manifest pins "
            f"{requirement.version} ({where}); check the new version, then update version and hash there"
        )
    elif requirement.hash is not None and current != requirement.hash:
        found.append(
            f"the server info or tools of source {source_id!r} changed: its content hash is {current} but the "
            f"manifest pins {requirement.hash} ({where}); check them (bastion actions show {manifest.name}), then "
            "update hash there"
        )
    return found


def _spec(manifest: Manifest, risk: Risk, risk_source: str, preview: PreviewFn) -> ActionSpec:
    tool = types.Tool(
        name=manifest.name,
        description=manifest.description,
        input_schema=manifest.input_schema(),
        annotations=types.ToolAnnotations(read_only_hint=risk == "read", destructive_hint=risk == "danger"),
    )
    declared = manifest.front.tier("risk")
    return ActionSpec(
        tool=tool,
        risk=risk,
        risk_source=risk_source,
        # The tier the file declares, while its steps have not raised the risk above the one that tier stands for.
        tier=declared if declared is not None and RISK_ALIASES[declared] == risk else None,
        namespace=MANIFEST_SOURCE_ID,
        steps=tuple((step.source, step.action) for step in manifest.front.execute),
        approval_required=manifest.front.approval.required,
        preview=preview,
    )


def _refusal(view: ManifestView, state_error: str | None) -> BastionError | None:
    if state_error is not None:
        return NotFound(f"manifest action {view.name} is disabled: {state_error}")
    if not view.enabled:
        return NotFound(f"manifest action {view.name} is disabled; enable it with `bastion actions enable {view.name}`")
    if view.reason is not None:
        return ConnectorUnavailable(f"manifest action {view.name} is unavailable: {view.reason}")
    return None


def _stopped(manifest: Manifest, step: Step, error: BastionError, done: Sequence[tuple[Step, str]]) -> BastionError:
    """The error a manifest call ends with when `step` failed: the step's class (a retriable one only when no step
    had run: a retry would repeat the finished ones), naming the step and what was left done."""
    child = f", invocation {error.invocation_id}" if error.invocation_id else ""
    if done:
        finished = ", ".join(f"{s.id} ({s.key}, invocation {invocation})" for s, invocation in done)
        after = f"; the steps before it completed and are not undone (no compensation): {finished}"
    else:
        after = "; no step had run"
    message = (
        f"{manifest.name}: step {step.id!r} ({step.key}{child}) failed: {error.error_class}: {error.message}{after}"
    )
    kind = UpstreamError if done and error.retriable else type(error)
    return kind(message)


def output_of(result: types.CallToolResult) -> Any:
    """What later steps read from a step (`${step.field}`): its structuredContent; else its text read as JSON when it
    is a JSON object or array; else `{"text": <its text>}`."""
    if result.structured_content is not None:
        return result.structured_content
    text = _text(result)
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"text": text}
    return parsed if isinstance(parsed, dict | list) else {"text": text}


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _result(
    manifest: Manifest, done: Sequence[tuple[Step, str]], scope: Mapping[str, Any], last: types.CallToolResult
) -> types.CallToolResult:
    """The manifest's result: a line naming the steps that ran, then the last step's content; structured, each
    step's invocation id and output, and the last output."""
    ran = ", ".join(f"{step.id} ({step.key})" for step, _ in done)
    summary = types.TextContent(type="text", text=f"{manifest.name}: {len(done)} step(s) completed: {ran}")
    steps = {
        step.id: {"invocation_id": child, "policy_key": step.key, "output": scope[step.id]} for step, child in done
    }
    return types.CallToolResult(
        content=[summary, *last.content],
        structured_content={"steps": steps, "output": scope[done[-1][0].id]},
    )

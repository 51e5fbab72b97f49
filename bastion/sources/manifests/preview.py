"""A manifest action's preview: its steps in order, each with its arguments resolved from the call's (a step's
output, known only once it ran, is shown as its reference) and the mode the gateway would give it."""

from __future__ import annotations

import json
from typing import Any

from bastion.errors import BastionError
from bastion.models import Invocation, Preview
from bastion.sources.manifests.model import Manifest
from bastion.sources.manifests.templates import TemplateError, deferred, render
from bastion.sources.seam import StepRunner


async def composite_preview(
    manifest: Manifest, steps: StepRunner, invocation: Invocation, arguments: dict[str, Any]
) -> Preview:
    """What a call of `manifest` would run (see the module); a step whose arguments cannot be resolved yet, or whose
    action is not offered now, says so in its place."""
    scope = {"args": manifest.arguments(arguments)}
    lines: list[str] = []
    for number, step in enumerate(manifest.front.execute, start=1):
        try:
            inputs: Any = render(deferred(step.inputs), scope)
        except TemplateError as exc:
            inputs = f"(not resolved: {exc})"
        try:
            mode = await steps.step_mode(
                invocation, step_id=step.id, source_id=step.source, action_id=step.action, arguments=inputs
            )
        except BastionError as exc:
            mode = f"not offered now: {exc.message}"
        lines.append(f"{number}. {step.id}: {step.key}  [{mode}]")
        shown = json.dumps(inputs, indent=2, ensure_ascii=False, sort_keys=True)
        lines += [f"   {line}" for line in shown.splitlines()]
    count = len(manifest.front.execute)
    return Preview(kind="steps", summary=f"{manifest.name} runs {count} step(s), in order", text="\n".join(lines))

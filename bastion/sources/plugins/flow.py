"""The flow of one plugin call: execute, verify; on a failed verification one repair if the package has
one, then verify again; still failing (or execute itself failing), roll back.

Its result is the plugin result envelope: `status` (`succeeded`, `reverted` or `failed` here; `queued` and
`rejected` are the pipeline's, before anything runs), the output, and the verification, repair and rollback
sections with a report of every step that ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from jsonschema.validators import validator_for

from bastion.sources.plugins.package import PluginPackage, Step, allowed
from bastion.sources.plugins.runner import StepRun, run_step
from bastion.sources.plugins.sandbox import Filesystem, Sandbox
from bastion.sources.secrets import scrub

Outcome = Literal["succeeded", "reverted", "failed"]
TERMINAL_STATUSES: Final = ("succeeded", "reverted", "queued", "rejected", "failed")


@dataclass(frozen=True)
class StepLimits:
    """Where and how every step of a plugin runs (`[plugins]` of bastion.toml), confined by `sandbox`."""

    workspace: Path
    sandbox: Sandbox
    state: Path
    """Where each call keeps its state directory (`<state>/<invocation id>`), kept while its outcome is unknown so
    that an approver can still roll it back after Bastion stopped (`bastion invocations rollback`)."""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    max_output: int = 1_048_576
    allowed_commands: Sequence[Sequence[str]] = ()


async def run_flow(
    package: PluginPackage,
    arguments: Mapping[str, Any],
    *,
    correlation_id: str,
    limits: StepLimits,
    state_dir: Path,
) -> dict[str, Any]:
    """Run one call of `package` through its whole flow and return the result envelope, scrubbed of the values of
    `[plugins] env` (a failing step may print its environment on stderr, echo a token in its output). Never raises
    for what a step does: every failure of a step is in the envelope."""
    envelope = await _run_flow(package, arguments, correlation_id, limits, state_dir)
    scrubbed: dict[str, Any] = scrub(envelope, limits.env.values())
    return scrubbed


async def run_rollback(
    package: PluginPackage,
    arguments: Mapping[str, Any],
    *,
    correlation_id: str,
    limits: StepLimits,
    state_dir: Path,
) -> dict[str, Any]:
    """Run only the package's rollback step for a call whose outcome is unknown (an approver's decision), with the
    call's payload and state directory; its report, scrubbed as a flow's envelope is."""
    flow = _Flow(package, limits, arguments, correlation_id, state_dir)
    report: dict[str, Any] = scrub((await flow.step("rollback")).report(), limits.env.values())
    return report


async def run_plan(
    package: PluginPackage,
    arguments: Mapping[str, Any],
    *,
    correlation_id: str,
    limits: StepLimits,
    state_dir: Path,
) -> StepRun:
    """Run only the package's `plan` step (its dry run) for a call about to be held, with the call's payload, the
    workspace read-only whatever the package's permissions (a plan changes nothing) and a state directory of its own
    (`state_dir`, which the caller removes); its run, its output scrubbed as a flow's envelope is."""
    filesystem: Filesystem = "none" if package.action.permissions.filesystem == "none" else "read"
    flow = _Flow(package, limits, arguments, correlation_id, state_dir, filesystem=filesystem)
    run = await flow.step("plan")
    return replace(
        run,
        output=scrub(run.output, limits.env.values()),
        error=scrub(run.error, limits.env.values()),
        stderr=scrub(run.stderr, limits.env.values()),
    )


async def _run_flow(
    package: PluginPackage, arguments: Mapping[str, Any], correlation_id: str, limits: StepLimits, state_dir: Path
) -> dict[str, Any]:
    flow = _Flow(package, limits, arguments, correlation_id, state_dir)
    execute = await flow.step("execute")
    output = execute.output or {}
    failure = execute.error or flow.output_problem(output)
    envelope: dict[str, Any] = {
        "status": "succeeded",
        "actionType": package.name,
        "riskTier": package.action.risk_tier,
        "output": output,
        "execute": execute.report() | ({"error": failure} if failure else {}),
        "verification": {"ok": False, "checks": []},
        "repair": {"attempted": False, "ok": False},
        "rollback": {"attempted": False, "ok": False},
        "feedback": {},
    }
    if failure is None:
        verification = await flow.verify(output)
        envelope["verification"] = verification
        if not verification["ok"] and "repair" in package.executables:
            repair = await flow.step("repair", output=output, verification=verification)
            envelope["repair"] = {"attempted": True, "ok": False, "step": repair.report()}
            if repair.ok:
                verification = await flow.verify(output)
                envelope["verification"] = verification
                envelope["repair"]["ok"] = verification["ok"]
        if verification["ok"]:
            return envelope
        failure = "verification failed" + (" after a repair" if envelope["repair"]["attempted"] else "")
    envelope["feedback"] = {"reason": failure}
    if "rollback" not in package.executables:
        envelope["status"] = "failed"
        return envelope
    rollback = await flow.step("rollback", output=output)
    envelope["rollback"] = {"attempted": True, "ok": rollback.ok, "step": rollback.report()}
    envelope["status"] = "reverted" if rollback.ok else "failed"
    return envelope


class _Flow:
    def __init__(
        self,
        package: PluginPackage,
        limits: StepLimits,
        arguments: Mapping[str, Any],
        correlation_id: str,
        state_dir: Path,
        *,
        filesystem: Filesystem | None = None,
    ) -> None:
        """One call's steps, each given the call's payload; `filesystem`: the workspace access of its steps, narrower
        than the package's own (None: the package's)."""
        self._package = package
        self._limits = limits
        self._state_dir = state_dir
        self._base = {
            "action": package.name,
            "input": dict(arguments),
            "correlationId": correlation_id,
            "workspace": str(limits.workspace),
            "stateDir": str(state_dir),
        }
        self._filesystem = filesystem or package.action.permissions.filesystem

    async def step(self, step: Step, **extra: Any) -> StepRun:
        """Run one of the package's executables with the call's payload (and `extra`) on its stdin."""
        return await self._run(self._package.executables[step], {**self._base, "step": step, **extra})

    def _confined(self, argv: Sequence[str]) -> list[str]:
        return self._limits.sandbox.argv(
            argv,
            filesystem=self._filesystem,
            package=self._package.directory,
            state=self._state_dir,
        )

    async def verify(self, output: Mapping[str, Any]) -> dict[str, Any]:
        """The package's verify executable, then each verification command: ok when every check passes."""
        checks: list[dict[str, Any]] = []
        if "verify" in self._package.executables:
            checks.append((await self.step("verify", output=dict(output))).report())
        for argv in self._package.verification_commands:
            if not allowed(argv, self._limits.allowed_commands):  # the allowlist changed since the package loaded
                checks.append({"command": list(argv), "ok": False, "error": "not in [plugins] allowed_commands"})
                continue
            checks.append((await self._run(argv, None)).report())
        return {"ok": all(check["ok"] for check in checks), "checks": checks}

    def output_problem(self, output: Mapping[str, Any]) -> str | None:
        """Why execute's output does not fit the package's outputSchema, if it does not."""
        schema = self._package.action.output_schema
        if schema is None:
            return None
        error = next(iter(validator_for(schema)(schema).iter_errors(output)), None)
        return None if error is None else f"its output does not fit outputSchema ({error.message})"

    async def _run(self, argv: Sequence[str], payload: Mapping[str, Any] | None) -> StepRun:
        limits = self._limits
        return await run_step(
            argv,
            payload,
            cwd=limits.workspace,
            env=limits.env,
            timeout=limits.timeout,
            max_output=limits.max_output,
            confine=self._confined,
        )

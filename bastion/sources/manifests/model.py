"""What a manifest action file says: the front matter's models, the loaded manifest,
and the problems found in a file.

The models validate one file on its own; what needs the rest of the configuration (which sources exist, what a
step's action offers) is checked by the loader (`not_found`) and at run time (`capability_denied`, availability).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bastion.errors import CapabilityDenied
from bastion.policies import KeepsTiers, RiskSetting

MAX_NAME: Final = 40
"""The longest manifest name: `actions__<name>` must stay within the 50 characters of a host-safe tool name."""

ProblemClass = Literal["parse_error", "validation_error", "capability_denied", "not_found"]
Boundary = Literal["manifest", "connector"]
"""Which side a problem is on: the manifest file itself, or a connector it requires (fix the connector's file)."""

InputType = Literal["string", "integer", "number", "boolean"]
_PYTHON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}
IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""Input names and step ids: what `${args.<name>}` and `${<step>.field}` can refer to."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Input(_Strict):
    """`[[inputs]]`: one argument of the action, compiled into its tool's JSON Schema."""

    name: str = Field(pattern=IDENTIFIER.pattern)
    """The argument's name (letters, digits, `_`; not starting with a digit), referred to as `${args.<name>}`."""
    type: InputType
    """Its JSON type: `string`, `integer`, `number` or `boolean`."""
    required: bool = True
    """Whether a call must give it."""
    description: str = Field(min_length=1)
    """What it is, for the agent (in the tool's input schema)."""
    default: str | int | float | bool | None = None
    """Used when the argument is not given (optional inputs only)."""

    @model_validator(mode="after")
    def _default_fits(self) -> Input:
        if self.default is None:
            return self
        if self.required:
            raise ValueError("a required input takes no default; set required = false or remove the default")
        wanted = _PYTHON_TYPES[self.type]
        if not isinstance(self.default, wanted) or (self.type != "boolean" and isinstance(self.default, bool)):
            raise ValueError(f"default {self.default!r} is not of the input's type {self.type}; fix one of them")
        return self

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of this argument."""
        schema: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.default is not None:
            schema["default"] = self.default
        return schema


class RequiredConnector(_Strict):
    """`[[requires.connectors]]`: a source the action calls, optionally pinned, and the actions it may call there."""

    id: str = Field(pattern=r"^[a-z0-9_-]+$")
    """The source id: a connector's, a provider's or another configured source's."""
    version: str | None = Field(default=None, min_length=1)
    """The server version the action was written against (its MCP server info); any other makes it unavailable."""
    hash: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    """The content hash of the connector's server info and tool definitions (`bastion actions show` prints it)."""
    capabilities: list[str] = Field(default_factory=list)
    """The subset of the source's actions (by their own names) the manifest may call: nothing else runs."""


class Requires(_Strict):
    """`[requires]`: what the action needs to run."""

    connectors: list[RequiredConnector] = Field(default_factory=list)
    """Every source a step calls (`[[requires.connectors]]`); a step on any other source is a validation error."""


class Step(_Strict):
    """`[[execute]]`: one action of another source, its inputs interpolated from the arguments and earlier steps."""

    id: str = Field(pattern=IDENTIFIER.pattern)
    """The step's name, unique in the file; later steps read its output as `${<id>.<field>}`."""
    source: str = Field(pattern=r"^[a-z0-9_-]+$")
    """The source id of the action it calls (listed in `[[requires.connectors]]`)."""
    action: str = Field(min_length=1)
    """The action's own name on that source (one of its `capabilities`)."""
    inputs: dict[str, Any] = Field(default_factory=dict)
    """The action's arguments; strings may hold `${args.<input>}` and `${<step>.<field>}` references."""

    @property
    def key(self) -> str:
        return f"{self.source}:{self.action}"


class Approval(_Strict):
    """`[approval]`: whether the action always waits for an approver."""

    required: bool = False
    """Always wait for an approver, even where policy would allow the action (policy may still deny it)."""


class FrontMatter(KeepsTiers, _Strict):
    """The `+++` TOML block of an action file."""

    _TIERED = ("risk",)

    name: str = Field(pattern=rf"^[a-z0-9][a-z0-9_-]{{0,{MAX_NAME - 1}}}$")
    """The action's name: tool `actions__<name>`, policy key `actions:<name>` (lower case, at most 40 characters)."""
    version: str = Field(pattern=r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
    """The action's own semantic version (`1.0.0`)."""
    risk: RiskSetting
    """`read`, `write` or `danger` (or a tier `R0`-`R4`, kept for policy: `R4 = 2` under `[approvers]`); its steps
    may raise it, never lower it."""
    source: str | None = None
    """Where the file was copied from (provenance only, never consulted)."""
    inputs: list[Input] = Field(default_factory=list)
    """The arguments (`[[inputs]]`), compiled into the tool's JSON Schema: no others are accepted."""
    requires: Requires = Field(default_factory=Requires)
    """The sources it calls and the actions it may call there."""
    execute: list[Step] = Field(min_length=1)
    """The steps (`[[execute]]`), run in order; the first failure stops the chain."""
    approval: Approval = Field(default_factory=Approval)
    """Whether it always waits for an approver."""

    def outside_capabilities(self) -> list[tuple[int, Step]]:
        """The steps (with their index) whose action is not among the capabilities declared for their source."""
        declared = {c.id: c.capabilities for c in self.requires.connectors}
        return [(i, s) for i, s in enumerate(self.execute) if s.action not in declared.get(s.source, [])]


class Manifest(_Strict):
    """A loaded action file: its front matter, its tool description (the body's first paragraph) and the rest."""

    front: FrontMatter
    file: Path
    description: str
    details: str
    """The body after the first paragraph (shown by `bastion actions show`)."""
    lines: dict[str, int] = Field(default_factory=dict)
    """The file line of each `[[requires.connectors]]` entry (`requires:<id>`) and step (`step:<id>`)."""

    @property
    def name(self) -> str:
        return self.front.name

    def requirement(self, source_id: str) -> RequiredConnector | None:
        return next((r for r in self.front.requires.connectors if r.id == source_id), None)

    def input_schema(self) -> dict[str, Any]:
        """The tool's JSON Schema, compiled from `[[inputs]]`: nothing but the declared arguments."""
        inputs = self.front.inputs
        return {
            "type": "object",
            "properties": {i.name: i.json_schema() for i in inputs},
            "required": [i.name for i in inputs if i.required],
            "additionalProperties": False,
        }

    def arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments with the defaults of the optional inputs not given."""
        defaults = {i.name: i.default for i in self.front.inputs if i.default is not None}
        return defaults | given

    def enforce_capabilities(self) -> None:
        """Refuse, before any step runs, a manifest with a step outside its declared capabilities (the
        action-boundary check, beside the policy each step still goes through)."""
        for _, step in self.front.outside_capabilities():
            requirement = self.requirement(step.source)
            declared = ", ".join(requirement.capabilities) if requirement and requirement.capabilities else "none"
            raise CapabilityDenied(
                f"{self.name}: step {step.id!r} calls {step.key}, outside the capabilities the manifest declares for "
                f"{step.source!r} ({declared}); nothing ran. Add {step.action!r} to its capabilities "
                f"({self.where(f'requires:{step.source}')}) or change the step"
            )

    def where(self, key: str) -> str:
        """`file:line` of a requirement (`requires:<id>`) or step (`step:<id>`), for messages naming the fix."""
        return f"{self.file}:{self.lines.get(key, 1)}"


class ManifestProblem(BaseModel):
    """One problem of one action file (a structured error): class, boundary, file, line and the fix."""

    model_config = ConfigDict(frozen=True)

    error_class: ProblemClass
    boundary: Boundary
    file: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.error_class}: {self.message}"

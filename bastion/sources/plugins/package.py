"""Loading plugin action packages: `actions/<name>/action.json` beside its executables.

A package is checked whole before it is offered: its `action.json` fits the frozen contract, its name is its own
(never a manifest action's, never another package's), its executables are there, an R2 action declares rollback,
and each verification command is declared in `permissions.commands` and matches the global command allowlist of
`bastion.toml`. Every problem names the file and line; a package with one is left out, the others load.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bastion.models import RISK_ALIASES, Risk
from bastion.sources.plugins.sandbox import Filesystem

ACTION_FILE: Final = "action.json"
STEPS: Final = ("execute", "verify", "repair", "rollback", "plan")
Step = Literal["execute", "verify", "repair", "rollback", "plan"]
"""`plan` (optional) is the dry run: what execute would do, worked out without changing anything (a held call's
preview); it runs with the workspace read-only."""
_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_INTERPRETERS: Final = {".py": sys.executable, ".js": "node", ".mjs": "node", ".cjs": "node"}
"""Executables run by an interpreter by their extension; any other file must be executable itself (shebang)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Permissions(_Strict):
    """`permissions`: what the package may have run for it and do with the workspace."""

    commands: list[str] = Field(default_factory=list)
    """The commands the package may have run for it: its verification commands, which Bastion runs (and nothing
    else: what a step runs itself cannot be confined to a list, so a package declaring more is refused)."""
    filesystem: Filesystem = "workspace"
    """What the steps may do with the workspace, applied by the sandbox (bastion.sources.plugins.sandbox)."""


class Verification(_Strict):
    """`verification`: the checks run after execute (and after a repair)."""

    required: bool = False
    """Whether the package must be verified: a verify executable or at least one command."""
    commands: list[str] = Field(default_factory=list)
    """Commands Bastion runs in the workspace after the verify executable, each split like a shell word list (never
    run by a shell); each must be in `permissions.commands` and match `[plugins] allowed_commands`."""


class Rollback(_Strict):
    """`rollback`: whether the package can undo what execute did."""

    required: bool = False
    """Whether a rollback executable must be there; an R2 action must set it."""


class Scope(_Strict):
    """A package's scope, relative to the workspace; `pathArguments` names the arguments it is checked on."""

    allowed_files: list[str] = Field(default_factory=list, alias="allowedFiles")
    """When given, a path argument must resolve to one of these files (or lie under an `allowedDirs` entry)."""
    allowed_dirs: list[str] = Field(default_factory=list, alias="allowedDirs")
    """When given, a path argument must resolve under one of these directories (or to an `allowedFiles` entry)."""
    forbidden_files: list[str] = Field(default_factory=list, alias="forbiddenFiles")
    """Paths no path argument may resolve to or under."""
    path_arguments: list[str] = Field(default_factory=list, alias="pathArguments")
    """The arguments (properties of `inputSchema`, strings or lists of strings) that are paths to check."""


class ActionFile(_Strict):
    """`action.json`, as the frozen plugin action contract has it (plus `title`, `description` and `scope`)."""

    name: str
    """The package's name, equal to its directory's: tool `plugins__<name>`, policy key `plugins:<name>`."""
    title: str | None = None
    """A title for hosts to show."""
    description: str | None = None
    """What the action does, for the agent."""
    risk_tier: Literal["R0", "R1", "R2", "R3", "R4"] = Field(alias="riskTier")
    """R0/R1 are read, R2 write, R3/R4 danger; R3 and R4 never run without an approver's decision."""
    input_schema: dict[str, Any] = Field(alias="inputSchema")
    """The JSON Schema of the arguments, checked before anything is recorded."""
    output_schema: dict[str, Any] | None = Field(default=None, alias="outputSchema")
    """The JSON Schema execute's output must fit; an output that does not is a failure (rolled back)."""
    permissions: Permissions = Field(default_factory=Permissions)
    """The commands run for it, and its access to the workspace."""
    verification: Verification = Field(default_factory=Verification)
    """How execute's work is checked."""
    rollback: Rollback = Field(default_factory=Rollback)
    """Whether it can be undone."""
    scope: Scope = Field(default_factory=Scope)
    """Which paths its path arguments may name, checked before the call is recorded and again before execute."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError('a name is 1-64 letters, digits, "_" or "-"')
        return value

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        try:
            validator_for(value).check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema ({exc.message})") from exc
        return value


@dataclass(frozen=True)
class PluginProblem:
    """Why a package is left out: the file and line to fix, and how."""

    file: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass(frozen=True)
class PluginPackage:
    """A loaded package: its declaration and the argument vector of each of its executables."""

    directory: Path
    action: ActionFile
    executables: dict[Step, tuple[str, ...]]
    verification_commands: tuple[tuple[str, ...], ...]

    @property
    def name(self) -> str:
        return self.action.name

    @property
    def risk(self) -> Risk:
        return RISK_ALIASES[self.action.risk_tier]

    @property
    def needs_approver(self) -> bool:
        """R3 and R4 never run without an approver's decision, whatever the policy says."""
        return self.action.risk_tier in ("R3", "R4")


def load_plugins(
    actions_dir: Path, *, allowed_commands: Sequence[Sequence[str]], taken: Collection[str] = ()
) -> tuple[list[PluginPackage], list[PluginProblem]]:
    """Every usable package under `actions_dir` (sorted by directory) and every problem of the others.

    `taken` are the names no plugin may have: the manifest actions' (`actions/<name>.md`), which plugins never
    override."""
    packages: list[PluginPackage] = []
    problems: list[PluginProblem] = []
    if not actions_dir.is_dir():
        return packages, problems
    for directory in sorted(p for p in actions_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        path = directory / ACTION_FILE
        if not path.is_file():
            continue
        found = _load(path, allowed_commands, taken, problems)
        if found is not None:
            packages.append(found)
    return packages, problems


def _load(
    path: Path, allowed_commands: Sequence[Sequence[str]], taken: Collection[str], problems: list[PluginProblem]
) -> PluginPackage | None:
    def refuse(loc: Sequence[str | int], message: str) -> None:
        problems.append(PluginProblem(path, _line_of(text, loc), f"{message} (this package is not loaded until then)"))

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(PluginProblem(path, 1, f"the file cannot be read as UTF-8 text ({exc}); fix or remove it"))
        return None
    except json.JSONDecodeError as exc:
        problems.append(PluginProblem(path, exc.lineno, f"not valid JSON: {exc.msg}; fix the syntax"))
        return None
    try:
        action = ActionFile.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "the file"
            refuse(tuple(error["loc"]), f"{where}: {error['msg']}")
        return None
    directory = path.parent
    before = len(problems)
    if action.name != directory.name:
        refuse(("name",), f'the name "{action.name}" differs from its directory "{directory.name}"; make them equal')
    if action.name in taken:
        refuse(("name",), f'"{action.name}" is already a manifest action (actions/{action.name}.md); rename one')
    executables: dict[Step, tuple[str, ...]] = {}
    for step in STEPS:
        found = _executable(directory, step)
        if isinstance(found, str):
            refuse(("name",), found)
        elif found is not None:
            executables[step] = found
    if "execute" not in executables and len(problems) == before:
        refuse(("name",), f"no execute executable in {directory}; add execute.py, execute.js or an executable file")
    if action.risk_tier == "R2" and not (action.rollback.required and "rollback" in executables):
        refuse(
            ("rollback",) if "rollback" in data else ("riskTier",),
            'an R2 (write) action must declare rollback: set "rollback": {"required": true} and add a rollback '
            "executable beside execute",
        )
    elif action.rollback.required and "rollback" not in executables:
        refuse(("rollback",), "rollback is required but there is no rollback executable; add rollback.py")
    verification = action.verification
    if verification.required and "verify" not in executables and not verification.commands:
        refuse(("verification",), "verification is required but there is no verify executable and no command")
    for i, command in enumerate(action.permissions.commands):
        if command not in verification.commands:
            refuse(
                ("permissions", "commands", i),
                f'"{command}" in permissions.commands is not a verification command: Bastion runs a package\'s '
                "verification commands for it, and cannot confine to a list what its steps run themselves (the "
                "sandbox confines their files); remove it, or make it a verification command",
            )
    commands: list[tuple[str, ...]] = []
    for i, command in enumerate(verification.commands):
        loc = ("verification", "commands", i)
        argv = tuple(shlex.split(command))
        if not argv:
            refuse(loc, "an empty verification command; remove it")
        elif command not in action.permissions.commands:
            refuse(loc, f'verification command "{command}" is not in permissions.commands; declare it there too')
        elif not allowed(argv, allowed_commands):
            refuse(
                loc,
                f'verification command "{command}" matches no entry of [plugins] allowed_commands in bastion.toml; '
                f"add {list(argv)!r} there if it is safe to run",
            )
        else:
            commands.append(argv)
    for name in action.scope.path_arguments:
        if name not in action.input_schema.get("properties", {}):
            refuse(("scope", "pathArguments"), f'path argument "{name}" is not a property of inputSchema; add it')
    if len(problems) > before:
        return None
    return PluginPackage(directory, action, executables, tuple(commands))


def allowed(argv: Sequence[str], allowlist: Sequence[Sequence[str]]) -> bool:
    """Whether an argument vector starts with one of the allowlist's vectors (compared word for word)."""
    return any(len(entry) <= len(argv) and tuple(argv[: len(entry)]) == tuple(entry) for entry in allowlist)


def _executable(directory: Path, step: Step) -> tuple[str, ...] | str | None:
    """The argument vector running a step's file (`<step>` or `<step>.<ext>`), None when there is none, or why it
    cannot run."""
    found = sorted(p for p in directory.iterdir() if p.is_file() and (p.name == step or p.stem == step))
    if not found:
        return None
    if len(found) > 1:
        return f"{len(found)} {step} executables ({', '.join(p.name for p in found)}); keep one"
    path = found[0]
    interpreter = _INTERPRETERS.get(path.suffix)
    if interpreter is not None:
        return (interpreter, str(path))
    if not path.stat().st_mode & 0o111:
        return f"{path.name} is not executable; chmod +x it (with a #! line) or name it {step}.py or {step}.js"
    return (str(path),)


def _line_of(text: str, loc: Sequence[str | int]) -> int:
    """The line of what `loc` leads to in a JSON text (a key, or an array's element; the deepest part found, 1 when
    none is)."""
    decoder = json.JSONDecoder()
    position, found = 0, 0
    try:
        for part in loc:
            if isinstance(part, str):
                match = re.compile(rf'"{re.escape(part)}"\s*:').search(text, position)
                if match is None:
                    break
                position, found = match.end(), match.start()
                continue
            position = text.index("[", position) + 1
            for _ in range(part):
                _, position = decoder.raw_decode(text, _skip_separators(text, position))
            position = found = _skip_separators(text, position)
    except (ValueError, json.JSONDecodeError):
        pass
    return text.count("\n", 0, found) + 1


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n,":
        position += 1
    return position

"""Reading action files: `+++` TOML front matter, then a Markdown body whose first paragraph is the
tool's description.

Every file of a folder is checked in one pass, and a broken file never stops the others: each problem is a
`ManifestProblem` with its class, boundary, file and line. Parse and validation errors leave the file out.
A step outside its manifest's capabilities (`capability_denied`) or a required source that is not configured
(`not_found`) is reported too, but the manifest is kept: the first is refused on every call before any step
runs, the second leaves it unavailable until the source exists.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Mapping
from datetime import date, time
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from bastion.config.tomlpos import (
    KeyIndex,
    KeyPath,
    describe_error,
    describe_syntax_error,
    dotted_key,
)
from bastion.models import MANIFEST_SOURCE_ID
from bastion.sources.manifests.model import (
    Boundary,
    FrontMatter,
    Manifest,
    ManifestProblem,
    ProblemClass,
)
from bastion.sources.manifests.templates import ARGS, TemplateError, references

DELIMITER: Final = "+++"
ACTIONS_DIR: Final = "actions"


class _File:
    """One action file being read: its problems, and the file line of a front matter key path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[ManifestProblem] = []
        self.index = KeyIndex("")
        self.offset = 0
        """Lines before the front matter's first line (the opening `+++` and anything above it)."""

    def report(
        self, line: int, message: str, error_class: ProblemClass = "validation_error", boundary: Boundary = "manifest"
    ) -> None:
        problem = ManifestProblem(
            error_class=error_class, boundary=boundary, file=self.path, line=line, message=message
        )
        self.problems.append(problem)

    def line_of(self, path: KeyPath) -> int:
        return self.offset + self.index.line_of(path)


def parse_manifest(path: Path, text: str) -> tuple[Manifest | None, list[ManifestProblem]]:
    """One action file: the manifest (None when a parse or validation error leaves it out) and its problems."""
    file = _File(path)
    split = _split(file, text)
    if split is None:
        return None, file.problems
    front_text, body = split
    file.index = KeyIndex(front_text)
    if file.index.too_deep is not None:
        file.report(file.offset + file.index.too_deep, "the front matter nests too deeply; flatten it", "parse_error")
        return None, file.problems
    try:
        data = tomllib.loads(front_text)
    except tomllib.TOMLDecodeError as exc:
        line, message = describe_syntax_error(exc, front_text)
        file.report(file.offset + line, message, "parse_error")
        return None, file.problems
    except RecursionError:
        file.report(file.offset + 1, "the front matter nests too deeply; flatten it", "parse_error")
        return None, file.problems
    try:
        front = FrontMatter.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            _report_invalid(file, error)
        return None, file.problems
    description, details = _description(body)
    if not description:
        file.report(
            file.offset + front_text.count("\n") + 2,
            "the body has no description; write a paragraph after the closing +++ (hosts show it as the tool's "
            "description)",
        )
    _check_structure(file, front)
    requires = front.requires.connectors
    if file.problems:
        return None, file.problems
    lines = {"name": file.line_of(("name",))}
    lines |= {f"requires:{r.id}": file.line_of(("requires", "connectors", i)) for i, r in enumerate(requires)}
    lines |= {f"step:{s.id}": file.line_of(("execute", i)) for i, s in enumerate(front.execute)}
    manifest = Manifest(front=front, file=path, description=description, details=details, lines=lines)
    _check_capabilities(file, front)
    return manifest, file.problems


def _split(file: _File, text: str) -> tuple[str, str] | None:
    """The front matter's text and the body; None (reported) when the delimiters are not where they must be."""
    lines = text.removeprefix("\ufeff").split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None or lines[first].strip() != DELIMITER:
        file.report(
            1 if first is None else first + 1,
            "an action file starts with a +++ line, then TOML front matter, then a closing +++ line; add them",
            "parse_error",
        )
        return None
    closing = next((i for i in range(first + 1, len(lines)) if lines[i].strip() == DELIMITER), None)
    if closing is None:
        message = "the front matter opened here is never closed; add a line with only +++ after it"
        file.report(first + 1, message, "parse_error")
        return None
    file.offset = first + 1
    return "\n".join(lines[first + 1 : closing]), "\n".join(lines[closing + 1 :])


def _description(body: str) -> tuple[str, str]:
    """The first paragraph (joined into one line) and the rest of the body."""
    paragraphs = [p.strip() for p in body.strip().split("\n\n")]
    first = paragraphs[0] if paragraphs else ""
    return " ".join(line.strip() for line in first.splitlines()), "\n\n".join(paragraphs[1:])


def _report_invalid(file: _File, error: Mapping[str, Any]) -> None:
    loc: KeyPath = tuple(error["loc"])
    if error["type"] == "value_error":  # a model validator's own message names the problem and the fix
        message = f"invalid {dotted_key(loc) or 'front matter'}: {str(error['msg']).removeprefix('Value error, ')}"
    elif error["type"] == "string_pattern_mismatch":
        message = f"invalid {dotted_key(loc)} = {error['input']!r}: {_PATTERN_HINTS.get(str(loc[-1]), error['msg'])}"
    else:
        message = describe_error(error, _known_keys(loc[:-1]))
    file.report(file.line_of(loc), message)


_PATTERN_HINTS: Final = {
    "name": 'use 1 to 40 lowercase letters, digits, "_" and "-" (for a manifest; input names are identifiers)',
    "version": 'use a semantic version such as "1.0.0"',
    "id": 'use lowercase letters, digits, "_" and "-" (a source id), or an identifier (a step id)',
    "source": "use the id of a configured source (a connector's id)",
    "hash": 'use "sha256:" and 64 hex digits, as `bastion actions show` prints it',
}


def _known_keys(loc: KeyPath) -> list[str]:
    """The keys accepted in the table at `loc` (to suggest the key meant instead of an unknown one)."""
    model: type[BaseModel] | None = FrontMatter
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part) if model is not None else None
        model = _model_of(info.annotation) if info is not None else None
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds directly or as `list[Model]`."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _check_structure(file: _File, front: FrontMatter) -> None:
    """What the models cannot see alone: unique names, steps on required sources, references that resolve."""
    seen_inputs: set[str] = set()
    for i, item in enumerate(front.inputs):
        if item.name in seen_inputs:
            file.report(file.line_of(("inputs", i, "name")), f'input "{item.name}" is declared twice; rename one')
        seen_inputs.add(item.name)
    required: set[str] = set()
    for i, connector in enumerate(front.requires.connectors):
        where = file.line_of(("requires", "connectors", i, "id"))
        if connector.id == MANIFEST_SOURCE_ID:
            file.report(where, "a manifest action cannot run other manifest actions; require a connector instead")
        elif connector.id in required:
            file.report(where, f'connector "{connector.id}" is required twice; merge the two entries')
        required.add(connector.id)
    steps: set[str] = set()
    for i, step in enumerate(front.execute):
        if step.id == ARGS or step.id in steps:
            what = '"args" names the arguments' if step.id == ARGS else "it is used by an earlier step"
            file.report(file.line_of(("execute", i, "id")), f'step id "{step.id}" cannot be used: {what}; rename it')
        if step.source not in required:
            file.report(
                file.line_of(("execute", i, "source")),
                f'step "{step.id}" calls source "{step.source}", which [[requires.connectors]] does not list; add '
                f'an entry with id = "{step.source}" and the actions it may call in capabilities',
            )
        _check_references(file, i, step.inputs, seen_inputs, steps)
        for at in _not_json(step.inputs, ()):
            file.report(
                file.line_of(("execute", i, "inputs", *at)),
                f"a TOML date or time in the inputs of step {step.id!r} is not a JSON value; quote it as a string",
            )
        steps.add(step.id)


def _not_json(value: Any, at: KeyPath) -> list[KeyPath]:
    """Where a value holds a TOML date or time (which tools, taking JSON, cannot be given)."""
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _not_json(item, (*at, key))]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _not_json(item, (*at, index))]
    return [at] if isinstance(value, date | time) else []


def _check_references(file: _File, index: int, inputs: dict[str, Any], names: set[str], earlier: set[str]) -> None:
    step = ("execute", index, "inputs")
    try:
        found = list(references(inputs))
    except TemplateError as exc:
        file.report(file.line_of(step), f"in the inputs of step {index + 1}: {exc}")
        return
    for at, reference in found:
        line = file.line_of((*step, *at))
        if reference.root == ARGS:
            if len(reference.path) != 1 or reference.path[0] not in names:
                known = ", ".join(sorted(names)) or "none"
                file.report(line, f"{reference} names no input (inputs: {known}); declare it in [[inputs]]")
        elif reference.root not in earlier:
            file.report(
                line,
                f"{reference} refers to no earlier step; a step can use only the outputs of the steps before it "
                f"(earlier steps: {', '.join(sorted(earlier)) or 'none'})",
            )


def _check_capabilities(file: _File, front: FrontMatter) -> None:
    """Each step's action must be among its source's declared capabilities; a call is refused until it is."""
    for i, step in front.outside_capabilities():
        declared = front.requires.connectors
        capabilities = next((c.capabilities for c in declared if c.id == step.source), [])
        file.report(
            file.line_of(("execute", i, "action")),
            f'step "{step.id}" calls {step.key}, outside the capabilities declared for "{step.source}" '
            f"({', '.join(capabilities) or 'none'}); add it to capabilities or change the step "
            "(every call is refused until then)",
            "capability_denied",
        )


def load_manifests(folder: Path, *, sources: Collection[str]) -> tuple[list[Manifest], list[ManifestProblem]]:
    """Every `*.md` action file of `folder` (none when it does not exist), checked in one pass.

    `sources` are the configured source ids: a required one that is not among them is `not_found`. Of two files
    with the same `name`, the first (by file name) wins.
    """
    if not folder.is_dir():
        return [], []
    loaded: dict[str, Manifest] = {}
    problems: list[ManifestProblem] = []
    for path in sorted(p for p in folder.glob("*.md") if p.is_file() and not p.name.startswith(".")):
        manifest, found = _read(path)
        problems.extend(found)
        if manifest is None:
            continue
        first = loaded.get(manifest.name)
        if first is not None:
            problems.append(
                ManifestProblem(
                    error_class="validation_error",
                    boundary="manifest",
                    file=path,
                    line=manifest.lines.get("name", 1),
                    message=f'action "{manifest.name}" is already defined by {first.file.name}, which wins; '
                    "rename one of them (this file is ignored until then)",
                )
            )
            continue
        loaded[manifest.name] = manifest
        for connector in manifest.front.requires.connectors:
            if connector.id not in sources and connector.id != MANIFEST_SOURCE_ID:
                problems.append(
                    ManifestProblem(
                        error_class="not_found",
                        boundary="connector",
                        file=path,
                        line=manifest.lines[f"requires:{connector.id}"],
                        message=f'no connector "{connector.id}" is configured; add connectors/{connector.id}.toml '
                        "(the action is unavailable until then)",
                    )
                )
    return list(loaded.values()), problems


def _read(path: Path) -> tuple[Manifest | None, list[ManifestProblem]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            why = "is not UTF-8 text; save it as UTF-8"
        else:
            why = f"cannot be read ({exc.strerror}); check its permissions"
        problem = ManifestProblem(
            error_class="parse_error", boundary="manifest", file=path, line=1, message=f"the file {why}"
        )
        return None, [problem]
    return parse_manifest(path, text)

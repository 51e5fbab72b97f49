"""Action files: the front matter and body read into a manifest, every problem of a folder of files with
its class, boundary, file and line in one pass, the enabled overlay, and `${...}` interpolation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bastion.errors import CapabilityDenied, ConfigError
from bastion.sources.manifests import ActionState, TemplateError, load_manifests, parse_manifest, render

GOOD = """+++
name = "stamp"
version = "1.2.0"
risk = "R3"

[[inputs]]
name = "text"
type = "string"
description = "What to write."

[[inputs]]
name = "count"
type = "integer"
required = false
default = 2
description = "How many times."

[[requires.connectors]]
id = "notes"
capabilities = ["write_note"]

[[execute]]
id = "save"
source = "notes"
action = "write_note"
inputs = { name = "n", text = "${args.text}" }

[approval]
required = true
+++
Write a note,
stamped.

Longer documentation that hosts do not see.
"""


def test_a_good_file_becomes_a_manifest_with_its_schema_description_and_risk_tier() -> None:
    manifest, problems = parse_manifest(Path("stamp.md"), GOOD)
    assert problems == []
    assert manifest is not None
    assert (manifest.name, manifest.front.risk, manifest.front.approval.required) == ("stamp", "danger", True)
    assert manifest.description == "Write a note, stamped."
    assert manifest.details == "Longer documentation that hosts do not see."
    assert manifest.input_schema() == {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "What to write."},
            "count": {"type": "integer", "description": "How many times.", "default": 2},
        },
        "required": ["text"],
        "additionalProperties": False,
    }
    assert manifest.arguments({"text": "x"}) == {"count": 2, "text": "x"}
    assert manifest.where("step:save") == "stamp.md:22"


BROKEN: dict[str, tuple[str, list[tuple[str, str, int]]]] = {
    "a_no_front_matter.md": ("Just prose.\n", [("parse_error", "manifest", 1)]),
    "b_unclosed.md": ('\n+++\nname = "x"\n', [("parse_error", "manifest", 2)]),
    "c_syntax.md": ('+++\nname = "x"\nversion = 1.0.0\n+++\nBody.\n', [("parse_error", "manifest", 3)]),
    "d_unknown_key.md": (
        GOOD.replace('risk = "R3"', 'risk = "R3"\nrisc = "read"'),
        [("validation_error", "manifest", 5)],
    ),
    "e_bad_risk_and_type.md": (
        GOOD.replace('risk = "R3"', 'risk = "high"').replace('type = "integer"', 'type = "int"'),
        [("validation_error", "manifest", 4), ("validation_error", "manifest", 13)],
    ),
    "f_unrequired_source.md": (
        GOOD.replace('source = "notes"', 'source = "fs"'),
        [("validation_error", "manifest", 24)],
    ),
    "g_unknown_references.md": (
        GOOD.replace("${args.text}", "${args.txt} ${later.field} ${oops"),
        [("validation_error", "manifest", 26)],
    ),
    "h_outside_capabilities.md": (
        GOOD.replace('action = "write_note"', 'action = "delete_note"').replace('"stamp"', '"wide"'),
        [("capability_denied", "manifest", 25)],
    ),
    "i_unconfigured_connector.md": (
        GOOD.replace('name = "stamp"', 'name = "other"').replace('"notes"', '"mail"'),
        [("not_found", "connector", 18)],
    ),
    "j_same_name.md": (GOOD, [("validation_error", "manifest", 2)]),
    "l_toml_date.md": (
        GOOD.replace('name = "n", text', 'name = "n", when = 2026-01-02, text').replace('"stamp"', '"dated"'),
        [("validation_error", "manifest", 26)],
    ),
    "k_no_description.md": (
        GOOD.replace('name = "stamp"', 'name = "quiet"').split("+++\nWrite")[0] + "+++\n",
        [("validation_error", "manifest", 30)],
    ),
}


def test_every_broken_file_of_a_folder_is_reported_in_one_pass_with_class_boundary_file_and_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "0_stamp.md").write_text(GOOD)
    for name, (text, _) in BROKEN.items():
        (tmp_path / name).write_text(text)
    manifests, problems = load_manifests(tmp_path, sources={"notes"})

    found: dict[str, list[tuple[str, str, int]]] = {}
    for problem in problems:
        found.setdefault(problem.file.name, []).append((problem.error_class, problem.boundary, problem.line))
        assert problem.message, problem
    assert found == {name: expected for name, (_, expected) in BROKEN.items()}
    assert sorted(m.file.name for m in manifests) == [
        "0_stamp.md",
        "h_outside_capabilities.md",
        "i_unconfigured_connector.md",
    ], "a capability or connector problem keeps the manifest (it is refused or unavailable); a broken file never "
    "stops the others"


def test_problem_messages_name_the_fix() -> None:
    _, problems = parse_manifest(Path("x.md"), (GOOD.replace("${args.text}", "${args.txt}")))
    assert "declare it in [[inputs]]" in problems[0].message
    _, problems = parse_manifest(Path("x.md"), (GOOD.replace('risk = "R3"', 'risc = "R3"')))
    assert any('did you mean "risk"?' in p.message for p in problems)
    _, problems = parse_manifest(Path("x.md"), (GOOD.replace('source = "notes"', 'source = "fs"')))
    assert 'add an entry with id = "fs"' in problems[0].message


def test_a_manifest_refuses_a_step_outside_its_capabilities_before_anything_runs() -> None:
    manifest, _ = parse_manifest(Path("x.md"), (GOOD.replace('action = "write_note"', 'action = "delete_note"')))
    assert manifest is not None
    with pytest.raises(CapabilityDenied, match="notes:delete_note"):
        manifest.enforce_capabilities()


# -- the enabled overlay ---------------------------------------------------------------------------------------


def test_the_overlay_keeps_each_choice_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    state = ActionState(tmp_path / "state" / "action-state.json")
    assert state.read() == {}
    state.set_enabled("stamp", False)
    state.set_enabled("other", True)
    again = ActionState(tmp_path / "state" / "action-state.json")
    assert again.read() == {"stamp": False, "other": True}
    assert json.loads((tmp_path / "state" / "action-state.json").read_text()) == {
        "other": {"enabled": True},
        "stamp": {"enabled": False},
    }
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["action-state.json"]


def test_a_broken_overlay_is_an_error_naming_the_fix_and_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "action-state.json"
    path.write_text('{"stamp": {"enabled": "no"}}')
    state = ActionState(path)
    with pytest.raises(ConfigError, match="delete it"):
        state.read()
    with pytest.raises(ConfigError):
        state.set_enabled("stamp", True)
    assert path.read_text() == '{"stamp": {"enabled": "no"}}'


# -- interpolation -----------------------------------------------------------------------------------------------


SCOPE: dict[str, Any] = {
    "args": {"name": "log", "count": 3, "flag": False},
    "list": {"notes": [{"name": "a", "characters": 1}, {"name": "b", "characters": 2}]},
}


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        ("${args.count}", 3),
        ("${args.flag}", False),
        ("${list.notes.1}", {"name": "b", "characters": 2}),
        ("n=${args.count} ${args.flag} ${list.notes.0.name}", "n=3 false a"),
        ("$${args.name} is ${args.name}", "${args.name} is log"),
        ({"a": ["${args.name}", "${args.missing}"], "b": "${args.missing}"}, {"a": ["log"]}),
        ("[${args.missing}]", "[]"),
    ],
)
def test_references_are_replaced_keeping_whole_values_typed(template: Any, rendered: Any) -> None:
    assert render(template, SCOPE) == rendered


@pytest.mark.parametrize(
    ("template", "mentions"),
    [("${list.notes.5.name}", "a list of 2"), ("${list.titles}", "notes"), ("${nope.x}", "'nope'")],
)
def test_a_reference_to_what_is_not_there_names_what_is(template: str, mentions: str) -> None:
    with pytest.raises(TemplateError, match=mentions):
        render(template, SCOPE)

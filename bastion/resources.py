"""The merged resources, resource templates and prompts of every source, and their routing (DESIGN.md §3).

- Resource URIs stay verbatim: they are the identifiers hosts read and subscribe by, and they appear
  inside tool results. Only the `name` of a resource or template is namespaced like a tool's
  (`<namespace>__<name>`, nothing when the namespace is `""`); it is a label, so it is not sanitised.
- A URI is routed to the source that lists it; else to the first source, in `source_id` order, with a
  template that matches it. When two sources list the same URI (or the same template), the first in
  `source_id` order keeps it and the other's is dropped with a warning.
- Prompts are addressed by name, so they get tool-style host names (sanitised, capped, collisions
  resolved by the same rule as tools) and `prompts/get` is routed back by that name.

Reading a resource or getting a prompt is not an action: policy gates tools only, and nothing here
is recorded in the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import mcp_types as types
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from bastion.policies import NameRequest, assign_tool_names

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceContent:
    """One source's resources, templates and prompts, exactly as it listed them."""

    source_id: str
    namespace: str
    resources: Sequence[types.Resource] = ()
    templates: Sequence[types.ResourceTemplate] = ()
    prompts: Sequence[types.Prompt] = ()


@dataclass(frozen=True, slots=True)
class PromptEntry:
    """A prompt as the host sees it, and where `prompts/get` goes."""

    name: str
    source_id: str
    upstream_name: str
    prompt: types.Prompt


@dataclass(frozen=True, slots=True)
class _Template:
    source_id: str
    uri_template: str
    matcher: UriTemplate | None


def namespaced(namespace: str, name: str) -> str:
    """The label of a resource or template: `<namespace>__<name>`, or the name itself when unprefixed."""
    return f"{namespace}__{name}" if namespace else name


class ContentCatalog:
    """What `resources/list`, `resources/templates/list` and `prompts/list` answer, and the routes back."""

    def __init__(self, contents: Iterable[SourceContent] = ()) -> None:
        ordered = sorted(contents, key=lambda c: c.source_id)
        self.warnings: list[str] = []
        self.resources: list[types.Resource] = []
        self._uri_owner: dict[str, str] = {}
        self.templates: list[types.ResourceTemplate] = []
        self._templates: list[_Template] = []
        for content in ordered:
            self._add_resources(content)
            self._add_templates(content)
        self.prompts: list[types.Prompt] = []
        self._prompts: dict[str, PromptEntry] = {}
        self._add_prompts(ordered)
        for warning in self.warnings:
            logger.warning("%s", warning)

    def _add_resources(self, content: SourceContent) -> None:
        for resource in content.resources:
            owner = self._uri_owner.setdefault(resource.uri, content.source_id)
            if owner != content.source_id:
                self.warnings.append(
                    f"resource URI collision on {resource.uri!r}: {owner} keeps it, {content.source_id}'s is not listed"
                )
                continue
            name = namespaced(content.namespace, resource.name)
            self.resources.append(resource if name == resource.name else resource.model_copy(update={"name": name}))

    def _add_templates(self, content: SourceContent) -> None:
        for template in content.templates:
            holder = next((t.source_id for t in self._templates if t.uri_template == template.uri_template), None)
            if holder is not None:
                self.warnings.append(
                    f"resource template collision on {template.uri_template!r}: {holder} keeps it, "
                    f"{content.source_id}'s is not listed"
                )
                continue
            self._templates.append(_Template(content.source_id, template.uri_template, _parse(template)))
            name = namespaced(content.namespace, template.name)
            self.templates.append(template if name == template.name else template.model_copy(update={"name": name}))

    def _add_prompts(self, ordered: Sequence[SourceContent]) -> None:
        by_key: dict[tuple[str, str], tuple[SourceContent, types.Prompt]] = {}
        for content in ordered:
            for prompt in content.prompts:
                if (content.source_id, prompt.name) in by_key:
                    self.warnings.append(
                        f"{content.source_id} lists the prompt {prompt.name!r} twice; the first is kept"
                    )
                    continue
                by_key[(content.source_id, prompt.name)] = (content, prompt)
        assignment = assign_tool_names(
            NameRequest(source_id=c.source_id, namespace=c.namespace, action_id=p.name) for c, p in by_key.values()
        )
        self.warnings.extend(w.replace("tool name collision", "prompt name collision") for w in assignment.warnings)
        for key, name in sorted(assignment.names.items(), key=lambda item: item[1]):
            content, prompt = by_key[key]
            shown = prompt if prompt.name == name else prompt.model_copy(update={"name": name})
            self._prompts[name] = PromptEntry(name, content.source_id, prompt.name, shown)
            self.prompts.append(shown)

    def route_uri(self, uri: str) -> str | None:
        """The source a resource URI belongs to: the one listing it, else the first whose template matches."""
        owner = self._uri_owner.get(uri)
        if owner is not None:
            return owner
        for template in self._templates:
            if template.matcher is not None and template.matcher.match(uri) is not None:
                return template.source_id
        return None

    def route_reference(self, uri: str) -> str | None:
        """The source of a completion's `ref/resource`: the template with that very text, else as `route_uri`."""
        for template in self._templates:
            if template.uri_template == uri:
                return template.source_id
        return self.route_uri(uri)

    def prompt(self, name: str) -> PromptEntry | None:
        return self._prompts.get(name)


def _parse(template: types.ResourceTemplate) -> UriTemplate | None:
    try:
        return UriTemplate.parse(template.uri_template)
    except InvalidUriTemplate as exc:
        logger.warning("resource template %r cannot be matched (%s); only exact URIs reach it", template.name, exc)
        return None

"""The merged resources, resource templates and prompts of every source: naming, routing and relaying.

- Resource URIs stay verbatim: they are the identifiers hosts read and subscribe by, and they appear
  inside tool results. Only the `name` of a resource or template is namespaced like a tool's
  (`<namespace>__<name>`, nothing when the namespace is `""`); it is a label, so it is not sanitised.
- A URI is routed to the source that lists it; else to the first source, in `source_id` order, with a
  template that matches it. When two sources list the same URI (or the same template), the first in
  `source_id` order keeps it and the other's is dropped with a warning.
- Prompts are addressed by name, so they get tool-style host names (sanitised, capped, collisions
  resolved by the same rule as tools) and `prompts/get` is routed back by that name.

- A URI that nothing lists or matches (servers accept subscriptions to URIs they create later) goes to
  the only source that offers resources, when exactly one does; otherwise it is refused naming the
  candidates.

Reading a resource or getting a prompt is not an action: policy gates tools only, and nothing here
is recorded in the ledger. `ContentRouter` forwards those requests, bounded by the call timeout, and
shares one upstream subscription per URI among every host that subscribed to it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import anyio
import mcp_types as types
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

from bastion.errors import BastionError, CallTimeout, NotFound
from bastion.policies import NameRequest, assign_tool_names
from bastion.sources.seam import ContentSource, UpdatedFn

logger = logging.getLogger(__name__)

ContentKind = Literal["resources", "prompts"]
"""The content listings a host re-lists after a change (resource templates go with resources)."""

_T = TypeVar("_T")


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


class ContentRouter:
    """Every content source's listings merged into one `ContentCatalog`, and requests routed back to them.

    Reading a resource, getting a prompt and completing an argument are forwarded as they are, bounded by
    `timeout`; subscriptions are counted per URI, so a source is subscribed once for all hosts and
    unsubscribed when the last host lets go.
    """

    def __init__(self, sources: Mapping[str, ContentSource], *, timeout: float) -> None:
        self._sources = dict(sources)
        self._timeout = timeout
        self._contents: dict[str, SourceContent] = {}
        self.catalog = ContentCatalog()
        """What hosts list now; rebuilt by `rebuild`."""
        self._update_listeners: list[UpdatedFn] = []
        self._subscriptions: dict[str, tuple[str, int]] = {}
        """Subscribed URI -> (the source subscribed to, how many host subscriptions share it)."""
        self._subscribing = anyio.Lock()

    def offers(self, source_id: str) -> bool:
        return source_id in self._sources

    def observe(self, source_id: str, namespace: str) -> set[ContentKind]:
        """Take a fresh listing of one source; returns the kinds of listing that changed."""
        source = self._sources[source_id]
        content = SourceContent(
            source_id=source_id,
            namespace=namespace,
            resources=tuple(source.resources()),
            templates=tuple(source.resource_templates()),
            prompts=tuple(source.prompts()),
        )
        before = self._contents.get(source_id, SourceContent(source_id, namespace))
        changed: set[ContentKind] = set()
        if (before.resources, before.templates) != (content.resources, content.templates):
            changed.add("resources")
        if before.prompts != content.prompts:
            changed.add("prompts")
        self._contents[source_id] = content
        return changed

    def rebuild(self) -> None:
        self.catalog = ContentCatalog(self._contents.values())

    def on_resource_updated(self, listener: UpdatedFn) -> None:
        """Register a coroutine called with the URI of every update of a subscribed resource."""
        self._update_listeners.append(listener)

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """Read a resource from the source that lists it (or whose template matches it)."""
        source = self._route(uri)
        return await self._bounded(f"resources/read {uri}", lambda: source.read_resource(uri))

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        """Get a prompt by its host name from its source, under the source's own name for it."""
        entry, source = self._prompt(name)
        return await self._bounded(f"prompts/get {name}", lambda: source.get_prompt(entry.upstream_name, arguments))

    async def complete(
        self,
        ref: types.PromptReference | types.ResourceTemplateReference,
        argument: types.CompletionArgument,
        context: types.CompletionContext | None,
    ) -> types.CompleteResult:
        """Route a completion by the prompt's host name (sent upstream under its own) or the template's URI."""
        if isinstance(ref, types.PromptReference):
            entry, source = self._prompt(ref.name)
            ref = ref.model_copy(update={"name": entry.upstream_name})
        else:
            source = self._route(ref.uri, self.catalog.route_reference(ref.uri))
        upstream_ref = ref
        return await self._bounded("completion/complete", lambda: source.complete(upstream_ref, argument, context))

    async def subscribe(self, uri: str) -> None:
        """One more host subscription to `uri`; the first one subscribes its source."""
        async with self._subscribing:
            held = self._subscriptions.get(uri)
            if held is not None:
                self._subscriptions[uri] = (held[0], held[1] + 1)
                return
            source = self._route(uri)
            await self._bounded(f"resources/subscribe {uri}", lambda: source.subscribe(uri, self._resource_updated))
            self._subscriptions[uri] = (source.source_id, 1)

    async def unsubscribe(self, uri: str) -> None:
        """One host subscription to `uri` fewer; the last one unsubscribes its source."""
        async with self._subscribing:
            held = self._subscriptions.get(uri)
            if held is None:
                return
            source_id, count = held
            if count > 1:
                self._subscriptions[uri] = (source_id, count - 1)
                return
            del self._subscriptions[uri]
            source = self._sources.get(source_id)
            if source is None:
                return
            try:
                await self._bounded(f"resources/unsubscribe {uri}", lambda: source.unsubscribe(uri))
            except BastionError as exc:
                logger.info("unsubscribing %s from %s failed: %s", source_id, uri, exc.message)

    async def _resource_updated(self, uri: str) -> None:
        for listener in self._update_listeners:
            await listener(uri)

    def _route(self, uri: str, routed: str | None = None) -> ContentSource:
        """The source for a URI: the one that lists it or whose template matches it; else, when exactly one source
        offers resources, that one (servers accept URIs they create later)."""
        source_id = routed or self.catalog.route_uri(uri)
        if source_id is None:
            offering = sorted(c.source_id for c in self._contents.values() if c.resources or c.templates)
            if len(offering) == 1:
                source_id = offering[0]
            else:
                candidates = f"candidates: {', '.join(offering)}" if offering else "no source offers resources"
                raise NotFound(
                    f"no resource or resource template matches {uri!r} ({candidates}); "
                    "list resources and templates to see what this gateway offers"
                )
        return self._source(source_id, f"no resource or resource template matches {uri!r}")

    def _prompt(self, name: str) -> tuple[PromptEntry, ContentSource]:
        entry = self.catalog.prompt(name)
        missing = f"no prompt named {name!r}"
        if entry is None:
            raise NotFound(f"{missing}; list prompts to see what this gateway offers")
        return entry, self._source(entry.source_id, missing)

    def _source(self, source_id: str, missing: str) -> ContentSource:
        source = self._sources.get(source_id)
        if source is None:
            raise NotFound(f"{missing}; list resources, templates and prompts to see what this gateway offers")
        return source

    async def _bounded(self, what: str, request: Callable[[], Awaitable[_T]]) -> _T:
        """A request to a source, bounded by the call timeout."""
        try:
            with anyio.fail_after(self._timeout):
                return await request()
        except TimeoutError as exc:
            raise CallTimeout(f"{what} did not answer within {self._timeout:g}s") from exc

"""A provider write's preview: the request it would send (method, URL, headers with credentials redacted, body),
built by the action's own code in a rehearsal (`Api(rehearsal=True)`) and never sent."""

from __future__ import annotations

import json
from typing import Final

import httpx2

from bastion.models import Preview
from bastion.sources.secrets import scrub

REDACTED: Final = "[REDACTED]"
_SECRET_HEADERS: Final = frozenset({"authorization", "proxy-authorization", "cookie"})
_SECRET_WORDS: Final = ("token", "secret", "api-key", "apikey", "password")


def request_preview(name: str, request: httpx2.Request, secret: str) -> Preview:
    """What `request` carries, as an approver reads it; the credential headers redacted, and the provider's token
    scrubbed wherever else it might be."""
    lines = [f"{request.method} {request.url}"]
    for header, value in request.headers.items():
        lowered = header.lower()
        hidden = lowered in _SECRET_HEADERS or any(word in lowered for word in _SECRET_WORDS)
        lines.append(f"{header}: {REDACTED if hidden else value}")
    body = request.content
    if body:
        try:
            shown = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError):
            shown = body.decode(errors="replace")
        lines += ["", shown]
    text = scrub("\n".join(lines), secret) if secret else "\n".join(lines)
    return Preview(kind="request", summary=f"{name} would send {request.method} {request.url}", text=str(text))

"""The preview stage of a held call: what it would do, worked out by its source without doing it (`ActionSpec.preview`),
within a time bound and a size bound, so the approver sees the effect beside the arguments.

A preview never stands in the way of the hold: one that fails or takes too long becomes `no preview: <why>`, and the
call is held all the same. The preview goes into the detail of the call's `pending` event, redacted there as
everything the ledger stores, and an approval's signature covers its digest (bastion.ledger.decisions).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from bastion.actions import ActionSpec
from bastion.errors import BastionError
from bastion.models import Invocation, Preview

logger = logging.getLogger(__name__)


async def preview_call(
    spec: ActionSpec, invocation: Invocation, arguments: dict[str, Any], *, timeout: float, max_bytes: int
) -> Preview | None:
    """The preview of a call of `spec` about to be held, cut to `max_bytes`; None when the action offers none."""
    if spec.preview is None:
        return None
    try:
        with anyio.fail_after(timeout):
            preview = await spec.preview(invocation, dict(arguments))
    except TimeoutError:
        return Preview.unavailable(f"it took longer than {timeout:g} s")
    except BastionError as exc:
        return Preview.unavailable(exc.message)
    except Exception as exc:  # a source's bug must not stop the hold: the boundary of the preview stage
        logger.exception("the preview of invocation %s (%s) failed unexpectedly", invocation.id, invocation.policy_key)
        return Preview.unavailable(f"it failed inside Bastion ({type(exc).__name__}); see the server log")
    return bounded(preview, max_bytes)


def bounded(preview: Preview, max_bytes: int) -> Preview:
    """`preview` with its text cut at a line to at most `max_bytes` UTF-8 bytes, and a last line saying what was cut."""
    if len(preview.text.encode()) <= max_bytes:
        return preview
    lines = preview.text.splitlines(keepends=True)
    kept: list[str] = []
    size = 0
    for line in lines:
        size += len(line.encode())
        if size > max_bytes:
            break
        kept.append(line)
    if not kept:  # one line longer than the budget: cut inside it
        kept = [lines[0].encode()[:max_bytes].decode(errors="ignore") + "\n"]
    elif not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    left = len(lines) - len(kept)
    note = f"[preview cut: {left} more line(s) not shown; previews keep {max_bytes} bytes]"
    return preview.model_copy(update={"text": "".join(kept) + note})

"""Manifest actions: composite actions declared in `actions/*.md` files.

`model` (what a file says), `parse` (the front matter and body of every file, each problem with class, boundary,
file and line), `templates` (`${...}` interpolation of step inputs) and `state` (which actions are enabled) are
pure but for reading files (and the overlay's atomic writes). `source` offers them as the source `actions`; their
steps, other sources' actions, run through the step runner the gateway binds it (`bastion.sources.seam`).
"""

from bastion.sources.manifests.model import Manifest, ManifestProblem, RequiredConnector, Step
from bastion.sources.manifests.parse import ACTIONS_DIR, load_manifests, parse_manifest
from bastion.sources.manifests.state import STATE_FILE, ActionState
from bastion.sources.manifests.templates import TemplateError, deferred, render

__all__ = [
    "ACTIONS_DIR",
    "STATE_FILE",
    "ActionState",
    "Manifest",
    "ManifestProblem",
    "RequiredConnector",
    "Step",
    "TemplateError",
    "deferred",
    "load_manifests",
    "parse_manifest",
    "render",
]

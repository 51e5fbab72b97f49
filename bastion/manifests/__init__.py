"""Manifest actions: composite actions declared in `actions/*.md` files.

Pure but for reading files (and the enabled overlay's atomic writes): `model` (what a file says), `parse` (the
front matter and body of every file, each problem with class, boundary, file and line), `templates` (`${...}`
interpolation of step inputs) and `state` (which actions are enabled). Running them is the pipeline's job
(`bastion.pipeline.manifests`): a manifest's steps are other sources' actions.
"""

from bastion.manifests.model import Manifest, ManifestProblem, RequiredConnector, Step
from bastion.manifests.parse import ACTIONS_DIR, load_manifests, parse_manifest
from bastion.manifests.state import STATE_FILE, ActionState
from bastion.manifests.templates import TemplateError, render

__all__ = [
    "ACTIONS_DIR",
    "STATE_FILE",
    "ActionState",
    "Manifest",
    "ManifestProblem",
    "RequiredConnector",
    "Step",
    "TemplateError",
    "load_manifests",
    "parse_manifest",
    "render",
]

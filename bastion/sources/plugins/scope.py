"""A plugin package's argument scope: the paths a plugin call names must stay where its package allows.

Paths are resolved the way the child would open them (relative to the workspace, symlinks and `..` followed),
so a link inside the workspace that points out of it, or at a forbidden file, is caught. Checked before the call
is recorded and again right before `execute` runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bastion.sources.plugins.package import Scope


def scope_violation(scope: Scope, workspace: Path, arguments: Mapping[str, Any]) -> str | None:
    """Why the call's path arguments leave the scope, or None when they all stay in it.

    Every path must resolve inside the workspace, not to (or under) a forbidden file, and, when the scope lists
    allowed files or directories, to one of those files or under one of those directories."""
    root = workspace.resolve()
    allowed_files = {_resolve(root, p) for p in scope.allowed_files}
    allowed_dirs = [_resolve(root, p) for p in scope.allowed_dirs]
    forbidden = [_resolve(root, p) for p in scope.forbidden_files]
    for name in scope.path_arguments:
        value = arguments.get(name)
        values = value if isinstance(value, list) else [value] if value is not None else []
        for raw in values:
            if not isinstance(raw, str):
                return f"argument {name!r} is not a path"
            try:
                path = _resolve(root, raw)
            except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a symlink loop
                return f"argument {name!r} ({raw!r}) is not a usable path ({exc})"
            if not path.is_relative_to(root):
                return f"argument {name!r} ({raw!r}) resolves to {path}, outside the workspace {root}"
            if any(path == f or path.is_relative_to(f) for f in forbidden):
                return f"argument {name!r} ({raw!r}) resolves to {path}, a forbidden file"
            if (allowed_files or allowed_dirs) and not (
                path in allowed_files or any(path.is_relative_to(d) for d in allowed_dirs)
            ):
                return f"argument {name!r} ({raw!r}) resolves to {path}, which is not an allowed file or directory"
    return None


def _resolve(root: Path, path: str) -> Path:
    """`path` as the child would reach it from `root`: absolute, symlinks and `..` resolved (missing parts kept)."""
    return (root / path).resolve()

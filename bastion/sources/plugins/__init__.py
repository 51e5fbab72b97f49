"""Plugin action packages: `actions/<name>/action.json` with `execute`, `verify`, `repair` and `rollback`
executables, loaded only when `[plugins] allow_plugin_code = true`.

`package` loads and checks packages (file and line for every problem), `runner` runs one step in a child process,
`scope` checks path arguments, `flow` runs execute, verify, repair and rollback into the plugin result envelope,
and `source` offers the packages to the catalog as the source `plugins`.
"""

from bastion.sources.plugins.flow import StepLimits, run_flow
from bastion.sources.plugins.package import ACTION_FILE, PluginPackage, PluginProblem, load_plugins
from bastion.sources.plugins.scope import scope_violation
from bastion.sources.plugins.source import PluginSource

__all__ = [
    "ACTION_FILE",
    "PluginPackage",
    "PluginProblem",
    "PluginSource",
    "StepLimits",
    "load_plugins",
    "run_flow",
    "scope_violation",
]

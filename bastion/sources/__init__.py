"""The sources of actions, side by side: downstream MCP servers (`mcp`), HTTP API providers (`providers`), plugin
action packages (`plugins`) and manifest actions (`manifests`). No kind imports another; what the pipeline needs of
a source is declared once, beneath them, in `seam`."""

"""Standalone demo programs shipped with Bastion (nothing in `bastion` imports them).

`python -m bastion.demo.notes` runs the bundled notes MCP server, the embedded default connector;
`python -m bastion.demo.call URL TOOL NAME=VALUE...` calls one tool through Bastion, as an agent host would.
"""

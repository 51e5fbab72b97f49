"""The official MCP conformance suite against Bastion: a fixture server, its baseline, and the runner."""

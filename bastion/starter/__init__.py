"""Template files of `bastion init` (read with importlib.resources)."""

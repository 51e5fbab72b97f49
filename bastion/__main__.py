"""`python -m bastion`: the same as the `bastion` command."""

from bastion.cli import main

main()

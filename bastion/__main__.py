"""`python -m bastion`: the same as the `bastion` command."""

from bastion.launcher import main

main()

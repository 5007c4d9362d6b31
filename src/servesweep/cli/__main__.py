"""`python -m servesweep.cli ARGS`: the `servesweep` command."""

from servesweep.cli import main

main()

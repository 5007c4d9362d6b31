"""`python -m servesweep.sim ARGS`: the SGLang emulator (same flags as `servesweep sim`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

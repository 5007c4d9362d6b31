"""`servesweep load` with the experimental locustfile (idle_parse_locustfile.py): same CLI, same arguments."""

import sys
from pathlib import Path

import servesweep.driver.command as _command

_command.LOCUSTFILE = Path(__file__).with_name("idle_parse_locustfile.py")

if __name__ == "__main__":
    from servesweep.cli import main

    sys.exit(main())

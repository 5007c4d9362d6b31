"""python -m servesweep.observe.dashboards [--out DIR] [--check]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servesweep.observe.dashboards import DEFAULT_DIR, check, write


def main(argv: list[str] | None = None) -> None:
    """Generate the Grafana dashboards (live, matrix, history) as JSON."""
    parser = argparse.ArgumentParser(prog="python -m servesweep.observe.dashboards", description=main.__doc__)
    parser.add_argument(
        "--out", default=str(DEFAULT_DIR), help=f"folder of the JSON files (default {DEFAULT_DIR})"
    )
    parser.add_argument(
        "--check",
        dest="check_only",
        action="store_true",
        help="fail if the committed JSON differs from the code",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: not a folder")
    if args.check_only:
        bad = check(out)
        if bad:
            print(
                "out of date (run python -m servesweep.observe.dashboards): " + ", ".join(bad),
                file=sys.stderr,
            )
            sys.exit(1)
        print(f"dashboards in {args.out} match the code")
        return
    for p in write(out):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()

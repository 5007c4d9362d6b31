"""python -m servesweep.observe.dashboards [--out DIR] [--check]"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from servesweep.observe.dashboards import DEFAULT_DIR, check, write


@click.command()
@click.option("--out", "out", default=str(DEFAULT_DIR), show_default=True, type=click.Path(file_okay=False))
@click.option("--check", "check_only", is_flag=True, help="fail if the committed JSON differs from the code")
def main(out: str, check_only: bool) -> None:
    """Generate the Grafana dashboards (live, matrix, history) as JSON."""
    if check_only:
        bad = check(Path(out))
        if bad:
            click.echo("out of date (run python -m servesweep.observe.dashboards): " + ", ".join(bad), err=True)
            sys.exit(1)
        click.echo(f"dashboards in {out} match the code")
        return
    for p in write(Path(out)):
        click.echo(f"wrote {p}")


if __name__ == "__main__":
    main()

"""`servesweep run FILE` or `servesweep run --resume runs/<run_id>`: an experiment matrix
(servesweep.matrix.orchestrator.run_matrix), exit code as docs/reports.md's table says."""

from __future__ import annotations

import sys

import click

from servesweep.cli.base import Command
from servesweep.matrix.orchestrator import run_matrix


@click.command(name="run", cls=Command)
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--resume", "resume", type=click.Path(file_okay=False), help="Continue runs/<run_id> where it stopped."
)
@click.option(
    "--out",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for run folders.",
)
@click.option("--keep-server", is_flag=True, help="Leave the last server running at the end.")
@click.option(
    "--max-parallel",
    type=click.IntRange(min=1),
    default=None,
    help="Run up to N placed server configurations at once on free GPUs of the inventory's hosts (servesweep plan "
    "shows the timeline); default 1: one after another. A decide: block packs its probes by default (as many "
    "as fit, as plan prices it); 1 there: one server at a time.",
)
@click.option(
    "--isolation-sample/--no-isolation-sample",
    default=True,
    show_default=True,
    help="With --max-parallel: run the first point of each packed configuration again alone after the packed phase "
    "(one more server start per configuration) and report packed vs alone; --no-isolation-sample skips it.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="The same matrix on the emulator here: every configuration, the ends of each load axis, one request per "
    "user, 8-token outputs; proves the pipeline.",
)
def command(
    file: str | None,
    resume: str | None,
    out: str,
    keep_server: bool,
    max_parallel: int | None,
    isolation_sample: bool,
    dry_run: bool,
) -> None:
    """Run an experiment matrix (or --resume one)."""
    sys.exit(
        run_matrix(
            file,
            resume,
            out,
            keep_server=keep_server,
            max_parallel=max_parallel,
            isolation_sample=isolation_sample,
            dry_run=dry_run,
        )
    )

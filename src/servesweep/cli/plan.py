"""`servesweep plan FILE`: expand an experiment file, drop infeasible points with their reason, estimate wall time
(servesweep.matrix.planner.plan_experiment); the plan as a table, or JSON."""

from __future__ import annotations

import json
import sys

import click

from servesweep.cli.base import Command
from servesweep.config.experiment import ExperimentError, load_experiment
from servesweep.matrix.planner import plan_experiment, plan_json, print_plan


@click.command(name="plan", cls=Command)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (for machines).")
@click.option(
    "--max-parallel",
    type=click.IntRange(min=1),
    default=None,
    help="Pack at most N servers at once (default: all that fit).",
)
def command(file: str, as_json: bool, max_parallel: int | None) -> None:
    """Expand an experiment file, drop infeasible points with their reason, estimate wall time."""
    from rich.console import Console

    try:
        exp = load_experiment(file)
    except ExperimentError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    plan = plan_experiment(exp, file, max_parallel)
    if as_json:
        click.echo(json.dumps(plan_json(plan), indent=2, default=str))
    else:
        print_plan(plan, Console(width=None if sys.stdout.isatty() else 160))

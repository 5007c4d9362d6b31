"""`servesweep report RUN`: write the HTML report and the Markdown summary of a run folder
(servesweep.results.report.write_report); a folder that cannot be read is exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from servesweep.cli.base import HELP, Command
from servesweep.results.report import HTML_NAME, MD_NAME, write_report
from servesweep.results.runfolder import RunError


@click.command(cls=Command, context_settings=HELP)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--baseline",
    "baselines",
    multiple=True,
    type=click.Path(path_type=Path),
    help="add a comparison with this run (repeatable)",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"where to write the HTML (default RUN_DIR/{HTML_NAME})",
)
@click.option(
    "--md",
    "md_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"where to write the Markdown (default RUN_DIR/{MD_NAME})",
)
def command(run_dir, baselines, html_path, md_path):
    """Write the HTML report (self-contained, opens offline) and the Markdown summary of a run folder."""
    try:
        h, m = write_report(run_dir, list(baselines), html_path, md_path)
    except RunError as e:
        click.echo(f"servesweep report: {e}", err=True)
        sys.exit(2)
    click.echo(f"html: {h}")
    click.echo(f"markdown: {m}")

"""`python exporters/exporter.py serve|push RUN`: servesweep's exporter for a finished run folder, its point
summaries served on /metrics or pushed to a Pushgateway (servesweep.observe.exporter.ClientMetrics)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from servesweep.cli.base import Group
from servesweep.observe.exporter import ClientMetrics, finished_points


@click.group(cls=Group)
def main():
    """servesweep's exporter: expose or push a finished run's point summaries."""


@main.command("serve")
@click.argument("run_dir", type=click.Path(exists=True))  # what report reads: a --records file too
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9464, show_default=True, type=int)
def serve(run_dir, host, port):
    """Serve /metrics with the run's point summaries until interrupted."""
    run_id, _ = finished_points(run_dir)
    m = ClientMetrics(run_id)
    n = m.load_run(Path(run_dir))
    bound = m.serve(host, port)
    click.echo(f"run {run_id}: {n} point(s) on http://{host}:{bound}/metrics (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        m.stop()


@main.command("push")
@click.argument("run_dir", type=click.Path(exists=True))  # what report reads: a --records file too
@click.option("--gateway", required=True, help="Pushgateway URL, e.g. http://127.0.0.1:9091")
@click.option("--job", default="servesweep", show_default=True)
def push(run_dir, gateway, job):
    """Push the run's point summaries to a Pushgateway (grouped by job and run_id)."""
    run_id, _ = finished_points(run_dir)
    m = ClientMetrics(run_id)
    n = m.load_run(run_dir)
    m.push(gateway, job)
    click.echo(f"pushed run {run_id}: {n} point(s) to {gateway} (job {job})")

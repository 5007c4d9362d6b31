"""`servesweep prom config|targets|backfill`: Prometheus helpers (servesweep.observe.promconfig)."""

from __future__ import annotations

import time

import click

from servesweep.cli.base import Group
from servesweep.observe.promconfig import backfill, run_openmetrics, write_prometheus_config, write_targets


@click.group(name="prom", cls=Group)
def command():
    """Prometheus helpers: scrape config, file_sd targets, backfill of finished runs."""


@command.command("config")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="prometheus.yml to write")
@click.option(
    "--sd-dir", required=True, help="folder of file_sd target files (absolute, or relative to --out)"
)
@click.option("--scrape-interval", default="5s", show_default=True)
@click.option("--pushgateway", default=None, help="host:port of a Pushgateway to scrape (honor_labels)")
def _config(out, sd_dir, scrape_interval, pushgateway):
    """Write a prometheus.yml that scrapes servesweep exporters and SGLang servers found in --sd-dir."""
    p = write_prometheus_config(out, sd_dir=sd_dir, scrape_interval=scrape_interval, pushgateway=pushgateway)
    click.echo(f"wrote {p}")


@command.command("targets")
@click.option("--sd-dir", required=True, type=click.Path(file_okay=False))
@click.option("--run-id", required=True)
@click.option(
    "--exporter", "exporters", multiple=True, help="host:port of a servesweep exporter (repeatable)"
)
@click.option(
    "--server", "servers", multiple=True, help="host:port[=config] of an SGLang server (repeatable)"
)
def _targets(sd_dir, run_id, exporters, servers):
    """Write the file_sd target files of one run."""
    sv: list[str | dict] = []
    for s in servers:
        t, _, cfg = s.partition("=")
        sv.append({"target": t, "config": cfg} if cfg else t)
    for p in write_targets(sd_dir, run_id, exporters=exporters, servers=sv):
        click.echo(f"wrote {p}")


@command.command("backfill")
@click.argument("run_dir", type=click.Path(exists=True))
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False), help="Prometheus data dir (or staging)"
)
@click.option("--openmetrics", "om_only", is_flag=True, help="only print the OpenMetrics text")
def _backfill(run_dir, out, om_only):
    """Import a finished run's summaries (a run or point folder, or a --records file) into Prometheus blocks."""
    if om_only:
        click.echo(run_openmetrics(run_dir), nl=False)
        return
    t0 = time.monotonic()
    blocks = backfill(run_dir, out)
    click.echo(f"imported {run_dir} into {len(blocks)} block(s) under {out} in {time.monotonic() - t0:.1f}s")

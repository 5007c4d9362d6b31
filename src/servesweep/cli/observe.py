"""`servesweep observe up|down|status|targets|backfill`: the standing observability stack
(servesweep.observe.stack)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from servesweep.cli.base import Group
from servesweep.exit_codes import CommandError
from servesweep.observe.stack import (
    DEFAULT_GRAFANA_PORT,
    DEFAULT_PORT,
    DEFAULT_RETENTION,
    backfill,
    down,
    status,
    up,
)
from servesweep.observe.stackdir import ENV_DIR, STACK_NAME, Layout, list_targets, stack_dir, targets_dir

_root_opt = click.option(
    "--root", default=None, type=click.Path(file_okay=False),
    help=f"results root; the stack lives in <root>/{STACK_NAME} (default runs). ${ENV_DIR}, if set, names the "
    "stack folder itself and wins.",
)  # fmt: skip


@click.group(name="observe", cls=Group)
def command():
    """A standing Prometheus (+ Grafana if installed) that sees every run through one targets folder."""


def _echo_urls(info: dict) -> None:
    prom = info["prometheus"]
    click.echo(f"stack      {info['dir']}")
    click.echo(
        f"targets    {info['targets']}   (export {ENV_DIR}={info['dir']} for processes started elsewhere)"
    )
    click.echo(f"prometheus {prom['url']}   (pid {prom['pid']}; targets page {prom['url']}/targets)")
    if info.get("grafana"):
        click.echo(f"grafana    {info['grafana']['url']}/d/servesweep-live   (pid {info['grafana']['pid']})")


@command.command("up")
@_root_opt
@click.option("--host", default="127.0.0.1", show_default=True, help="address Prometheus and Grafana bind")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--prometheus", "prometheus", default=None, help="Prometheus binary (default: `prometheus` on PATH)"
)
@click.option(
    "--retention", default=DEFAULT_RETENTION, show_default=True, help="--storage.tsdb.retention.time"
)
@click.option("--scrape-interval", default="5s", show_default=True)
@click.option("--pushgateway", default=None, help="host:port of a Pushgateway to scrape too")
@click.option(
    "--grafana", "grafana", default=None, help="Grafana binary (default: grafana-server/grafana on PATH)"
)
@click.option("--no-grafana", is_flag=True, help="only provision Grafana's files, start none")
@click.option(
    "--grafana-port", default=DEFAULT_GRAFANA_PORT, show_default=True, type=click.IntRange(1, 65535)
)
@click.option(
    "--timeout", default=60.0, show_default=True, help="seconds to wait for each service to be ready"
)
def _up(root, host, port, prometheus, retention, scrape_interval, pushgateway, grafana, no_grafana, grafana_port,
        timeout):  # fmt: skip
    """Start the stack (idempotent: a running one is found and kept) and print its URLs."""
    try:
        info = up(root, host=host, port=port, prometheus=prometheus, retention=retention,
                  scrape_interval=scrape_interval, pushgateway=pushgateway,
                  grafana=False if no_grafana else grafana, grafana_port=grafana_port, timeout=timeout)  # fmt: skip
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        raise CommandError(str(e)) from None
    click.echo("started: " + ", ".join(info["started"]) if info["started"] else "already running")
    prom = info["prometheus"]
    if "prometheus" not in info["started"] and (prom["url"], prom.get("retention")) != (
        f"http://{host}:{port}",
        retention,
    ):  # a running Prometheus keeps its address and retention; say so rather than pretend
        click.echo(f"note: the running Prometheus keeps {prom['url']}, retention {prom.get('retention')}; "
                   "`servesweep observe down` first to change them")  # fmt: skip
    _echo_urls(info)
    if info["hint"]:
        click.echo(info["hint"])


@command.command("down")
@_root_opt
@click.option("--timeout", default=20.0, show_default=True, help="seconds between SIGTERM and SIGKILL")
def _down(root, timeout):
    """Stop the Prometheus (and Grafana) this stack started; data and targets stay."""
    stopped = down(root, timeout=timeout)
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running in {stack_dir(root)}")


@command.command("status")
@_root_opt
@click.option("--json", "as_json", is_flag=True, help="machine-readable")
def _status(root, as_json):
    """Show the stack and the health of every target; exit 3 when its Prometheus is not running."""
    st = status(root)
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
    elif st["prometheus"] is None:
        click.echo(f"not running ({st['dir']}); start it with: servesweep observe up")
    else:
        _echo_urls(st)
        click.echo(f"ready      {st['ready']}; {len(st['active'])} active target(s)")
        for t in st["active"]:
            click.echo(
                f"  {t['health']:<7} {t['job']:<10} {t['instance']:<22} run_id={t['run_id']} {t['error']}"
            )
    if st["prometheus"] is None:
        sys.exit(3)


@command.command("targets")
@_root_opt
@click.option("--json", "as_json", is_flag=True, help="machine-readable")
def _targets(root, as_json):
    """List the registered target files (what Prometheus discovers)."""
    rows = list_targets(root)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{targets_dir(root)}: {len(rows)} group(s)")
    for r in rows:
        lab = " ".join(f"{k}={v}" for k, v in r["labels"].items())
        click.echo(
            f"  {r['job']:<10} {','.join(r['targets']) or '-':<24} {lab} {r.get('error', '')}  [{Path(r['file']).name}]"
        )


@command.command("backfill")
@_root_opt
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True))
def _backfill(root, run_dirs):
    """Import finished runs into the stack's history (promtool; a running Prometheus loads them within about a
    minute): whatever `report` reads, i.e. run folders, point folders and a headless Locust's --records file."""
    for rd in run_dirs:
        try:
            blocks = backfill(rd, root)
        except (FileNotFoundError, RuntimeError, ValueError) as e:
            raise CommandError(str(e)) from None
        click.echo(f"{rd}: {len(blocks)} block(s) into {Layout(stack_dir(root)).prom / 'data'}")

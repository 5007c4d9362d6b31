"""`servesweep sglang-cpu install|model|experiment|serve`: real SGLang on this CPU with a tiny offline model
(servesweep.sglang.cpu.machine; docs/sglang-cpu.md).

    servesweep sglang-cpu install            # SGLang 0.5.23's venv under $SERVESWEEP_CACHE_DIR (2-4 min once)
    servesweep sglang-cpu model              # the tiny model's folder (built offline in ~10 s once)
    servesweep sglang-cpu serve [--port P] [-- SGLANG FLAGS]   # foreground; Ctrl-C stops it and its children
    servesweep sglang-cpu experiment examples/sglang-cpu.yaml -o my.yaml   # fill in this machine's paths
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from servesweep.cli.base import Group
from servesweep.sglang.cpu import machine


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@click.group("sglang-cpu", cls=Group)
def command():
    """Real SGLang on this machine's CPU with a tiny offline model (no GPU): see docs/sglang-cpu.md."""


@command.command("install")
@click.option("--force", is_flag=True, help="rebuild even if the stamp matches the pins")
def install_cmd(force: bool):
    """Install SGLang's venv (pinned; rebuilt when the pins change) and print its python."""
    click.echo(str(machine.install(_log, force=force)))


@command.command("model")
def model_cmd():
    """Build the tiny model (if missing) and print its folder."""
    click.echo(str(machine.model(_log)))


@command.command("experiment")
@click.argument("template", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the experiment file to write")  # fmt: skip
def experiment_cmd(template: Path, out: Path):
    """Write TEMPLATE (e.g. examples/sglang-cpu.yaml) with this machine's SGLang python and model filled in."""
    text = machine.render_experiment(template.read_text(), _log)
    out.write_text(text)
    click.echo(str(out))


@command.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=30000, show_default=True, type=int)
@click.option("--startup-timeout", default=300.0, show_default=True, type=float, help="seconds")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(host: str, port: int, startup_timeout: float, sglang_args: tuple[str, ...]):
    """Start real SGLang with the tiny model in the foreground; Ctrl-C (or SIGTERM) stops it and its children.

    SGLANG_ARGS after `--` are added to the CPU flags (e.g. `-- --max-running-requests 2`)."""
    machine.serve(host, port, startup_timeout, list(sglang_args), _log)
    sys.exit(0)

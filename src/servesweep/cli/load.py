"""`servesweep load`: its options (every knob of the table, config.point.knobs, the sweep axes and the run's own
settings) and `--resume`; the run is servesweep.driver.load.run_load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from servesweep.cli.base import HELP, Command
from servesweep.config.point import DEFAULT_MAX_FAILURE_RATE, Knob, knobs
from servesweep.driver.load import DEFAULT_SIM_ARGS, SWEEP_AXES, resumed_argv, run_load
from servesweep.exit_codes import BadOption, UsageError


def _knob_option(k: Knob) -> Callable:
    """The click option of one knob of the table (config.point.knobs): its CLI name, help, group and default."""
    default = k.option_default("cli")
    help = f"[{k.group}] {k.help}"
    if k.kind == "flag":
        return click.option(k.cli, k.dest, is_flag=True, help=help)
    if k.kind == "switch":
        return click.option(k.cli, k.dest, type=click.Choice(["on", "off"]), default=None, help=help)
    types = {"choice": click.Choice(list(k.choices)), "int": int, "float": float}
    return click.option(
        k.cli,
        k.dest,
        type=types.get(k.kind, str),
        default=default,
        show_default=default is not None,
        help=help,
    )


# `servesweep load`'s options that are not one point's knobs: the sweep axes (driver.load.SWEEP_AXES) and the run's
# own settings.
_AXIS_OPTIONS = [
    click.option(
        "--concurrency", "concurrency_text", default="8", show_default=True, help="N or a sweep: 1,2,4,8"
    ),
    click.option("--rate", "rate_text", default=None, help="open loop: requests/s, or a sweep: 1,2,4"),
]
_RUN_OPTIONS = [
    click.option(
        "--api-key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="file holding the API key (mode 0600); it reaches Locust through its environment only",
    ),
    click.option(
        "--workers",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Locust worker processes per point on this machine (0: one process)",
    ),
    click.option(
        "--worker-inventory",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="run the workers on the hosts of this Ansible inventory (the locust_worker role, over SSH)",
    ),
    click.option(
        "--worker-group", default="loadgen", show_default=True, help="inventory group of worker hosts"
    ),
    click.option("--workers-per-host", type=click.IntRange(min=1), default=1, show_default=True),
    click.option("--master-host", default=None, help="address of this machine the worker hosts connect to"),
    click.option("--master-port", type=click.IntRange(1, 65535), default=5557, show_default=True),
    click.option(
        "--slo", default=None, help="e.g. 'ttft_p99<=2s,itl_p99<=50ms' or per request 'ttft<=2s' (goodput)"
    ),
    click.option(
        "--max-failure-rate",
        default=f"{DEFAULT_MAX_FAILURE_RATE:.0%}",
        show_default=True,
        help="exit 3 when a point's failed share of measured requests is above this (0.05 or 5%; 100%: "
        "off); a point with 0 successes always does; any failure below it is a warning on stderr",
    ),
    click.option(
        "--metrics-port",
        type=click.IntRange(min=0),
        default=0,
        help="serve the run's live client metrics on this port of 127.0.0.1 for the whole run (0: a free port "
        "when an observe stack is set up, else none); registered in the stack either way",
    ),
    click.option(
        "--sim-args",
        default=DEFAULT_SIM_ARGS,
        show_default=True,
        help="emulator flags when --base-url is omitted (a --model-path is added when missing)",
    ),
    click.option(
        "--out",
        "out_root",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("runs"),
        show_default=True,
    ),
    click.option("--json", "as_json", is_flag=True, help="print the summaries as JSON instead of the table"),
    click.option(
        "--resume",
        "resume_dir",
        type=click.Path(file_okay=False, exists=True, path_type=Path),
        default=None,
        help="finish a stopped `servesweep load` run in its own folder: the points it did not measure, with the "
        "options it was started with (its manifest's argv; give no other option)",
    ),
]


def _options(f: Callable) -> Callable:
    """--base-url, the sweep axes, every knob of the table but the swept ones, then the run's own options."""
    opts = [
        click.option(
            "--base-url", default=None, help="server root (http://HOST:PORT); omitted: start the emulator"
        ),
        *_AXIS_OPTIONS,
        *(_knob_option(k) for k in knobs("cli") if k.cli not in SWEEP_AXES),
        *_RUN_OPTIONS,
    ]
    for opt in reversed(opts):  # click lists options in the order of the decorators, the last applied first
        f = opt(f)
    return f


@click.command(cls=Command, context_settings=HELP)
@_options
def command(**opts):
    """Run one load point or a sweep (concurrency and/or open-loop rate; one Locust run per point) and print the
    results table. Exit codes: docs/reports.md, "Exit codes"."""
    if opts["resume_dir"] is not None:
        opts = _resumed_options(opts["resume_dir"])
    run_load(opts)


def _resumed_options(run_dir: Path) -> dict[str, Any]:
    """`--resume RUN`: the options RUN was started with, parsed again from its manifest's argv (so its points are
    the same points); any other option on this command line is a usage error, since it would change them."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [
        f"--{p.name.replace('_', '-')}"
        for p in ctx.command.params
        if p.name not in (None, "resume_dir")
        and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
    ]
    if given:
        raise UsageError(
            f"--resume takes no other option (the run's own are in its manifest.json): got {', '.join(given)}"
        )
    args = resumed_argv(run_dir)
    try:
        with command.make_context("load", args, parent=ctx.parent) as sub:
            opts = dict(sub.params)
    except click.ClickException as e:
        raise BadOption(f"{run_dir}: its argv no longer parses: {e.format_message()}", "--resume") from None
    opts["resume_dir"] = run_dir
    return opts

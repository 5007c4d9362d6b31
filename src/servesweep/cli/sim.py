"""`servesweep sim ARGS`: the SGLang emulator with SGLang's launch_server flags (servesweep.sim.cli parses them with
SGLang's own parser; its --help lists them)."""

from __future__ import annotations

import sys

import click

from servesweep.sim.cli import main


@click.command(
    name="sim",
    context_settings=dict(ignore_unknown_options=True, allow_extra_args=True, help_option_names=[]),
    add_help_option=False,
)
@click.pass_context
def command(ctx: click.Context) -> None:
    """Run the SGLang emulator (takes SGLang's launch_server flags; --help lists them)."""
    sys.exit(main(list(ctx.args)))

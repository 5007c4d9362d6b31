"""The one place a domain error (servesweep.exit_codes: `CommandError`, `CouldNotRun`, `UsageError`, `BadOption`)
becomes what the user sees: click's `Error: ...` (under the usage line for a usage error or a bad option) and the
error's exit code. Every servesweep command and group is made with `Command` or `Group`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from servesweep.exit_codes import COULD_NOT_RUN, BadOption, CommandError, UsageError

HELP = {"help_option_names": ["-h", "--help"]}


@contextmanager
def domain_errors(ctx: click.Context) -> Iterator[None]:
    """Re-raise a domain error as click's exception of the same message and exit code, for `ctx`'s command."""
    try:
        yield
    except BadOption as e:
        raise click.BadParameter(e.message, ctx=ctx, param_hint=e.option) from None
    except UsageError as e:
        raise click.UsageError(e.message, ctx=ctx) from None
    except CommandError as e:
        raise (_CouldNotRun if e.exit_code == COULD_NOT_RUN else click.ClickException)(e.message) from None


class _CouldNotRun(click.ClickException):
    exit_code = COULD_NOT_RUN


class Command(click.Command):
    def invoke(self, ctx: click.Context) -> Any:
        with domain_errors(ctx):
            return super().invoke(ctx)


class Group(click.Group):
    """A group whose subcommands are `Command`s and `Group`s by default; a subcommand made elsewhere with plain
    click still has its domain errors turned here (with the group's usage line)."""

    command_class = Command
    group_class = type

    def invoke(self, ctx: click.Context) -> Any:
        with domain_errors(ctx):
            return super().invoke(ctx)

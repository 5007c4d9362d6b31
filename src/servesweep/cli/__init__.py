"""The `servesweep` command. Each subcommand is a module of this package (options, output, exit) that calls the
domain function doing its work, imported lazily, so `servesweep sim` never imports Locust and `servesweep run`
never imports gevent. Domain modules raise servesweep.exit_codes' errors; `base.domain_errors` turns them into
click's messages and exit codes, once for every command."""

from __future__ import annotations

import importlib
import importlib.util

import click

from servesweep.cli.base import Group

# subcommand -> (module, attribute holding a click.Command, one-line help)
# fmt: off
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "sim": ("servesweep.cli.sim", "command", "Run the SGLang emulator (an SGLang-compatible server on a simulated GPU)."),
    "load": ("servesweep.cli.load", "command", "Run one load point or a concurrency sweep against a server."),
    "prompts": ("servesweep.cli.prompts", "command", "Build or warm a prompt pool, show a prompt, or check a dataset."),
    "trace": ("servesweep.cli.trace", "command", "Request traces: convert to the native format, stats, sample a window."),
    "plan": ("servesweep.cli.plan", "command", "Expand an experiment file, drop infeasible points, estimate time."),
    "run": ("servesweep.cli.run", "command", "Run an experiment matrix (or --resume one)."),
    "report": ("servesweep.cli.report", "command", "Write the HTML and Markdown report of a run folder."),
    "compare": ("servesweep.cli.compare", "command", "Compare runs point by point, with confidence intervals."),
    "prom": ("servesweep.cli.prom", "command", "Prometheus config, file_sd targets, backfill of finished runs."),
    "observe": ("servesweep.cli.observe", "command", "A standing Prometheus (+ Grafana) that sees every run: up, down, status."),
    "gate": ("servesweep.cli.gate", "command", "Check a run against SLOs and a baseline; exit 0 pass, 1 breach, 2 error."),
    "sglang-cpu": ("servesweep.cli.sglang_cpu", "command", "Real SGLang on this CPU with a tiny offline model: install, model, serve."),
}
# fmt: on


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class LazyGroup(Group):
    def list_commands(self, ctx):
        return [name for name, (mod, _, _) in SUBCOMMANDS.items() if _exists(mod)]

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return None
        mod, attr, _ = SUBCOMMANDS[name]
        try:
            return getattr(importlib.import_module(mod), attr)
        except ModuleNotFoundError as e:
            if e.name == mod:
                return None
            raise

    def format_commands(self, ctx, formatter):
        rows = [(n, SUBCOMMANDS[n][2]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="servesweep")
def main():
    """servesweep: benchmark matrices for LLM serving."""

"""`servesweep compare BASELINE RUN [RUN ...]`: runs compared point by point, with confidence intervals
(servesweep.results.compare); the table, JSON, compact lines for CI logs or an HTML page. A run folder that cannot
be read, no matching points, or packed points against alone ones without --allow-packed-vs-alone: exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from servesweep.cli.base import HELP, Command
from servesweep.exit_codes import BadOption, UsageError
from servesweep.results.compare import (
    RunComparison,
    _few,
    cause_lines,
    compact_lines,
    compare_runs,
    metric,
    parse_fraction,
    rich_table,
    write_compare_html,
)
from servesweep.results.runfolder import RunError, load_run


def _check_packing(rcs: list[RunComparison], allow: bool) -> None:
    """A packed point next to an alone one measures co-location as much as the change: refused unless allowed,
    and said either way."""
    for rc in rcs:
        mixed = rc.settings.get("packed_vs_alone") or []
        if not mixed:
            continue
        what = f"{len(mixed)} point pair(s) of {rc.a.path} and {rc.b.path} ran one packed, one alone: {_few(mixed)}"
        if not allow:
            click.echo(
                f"servesweep compare: {what}; co-located servers share CPU, memory bandwidth, PCIe and power, so "
                "the difference is not the change alone (see the packed run's isolation section). Compare runs "
                "of one kind, or pass --allow-packed-vs-alone.",
                err=True,
            )
            sys.exit(2)
        click.echo(f"warning: {what} (--allow-packed-vs-alone)", err=True)


@click.command(cls=Command, context_settings=HELP)
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--metric", "metric_names", multiple=True, help="metric to compare (repeatable); default: the table's"
)
@click.option("--resamples", type=click.IntRange(100, 100_000), default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True)
@click.option(
    "--min-effect",
    default="2%",
    show_default=True,
    help="a change smaller than this is within noise even when its interval excludes zero",
)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of the table")
@click.option(
    "--compact",
    is_flag=True,
    help="for CI logs: the summary line and one line per better or worse change, no table",
)
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--allow-packed-vs-alone",
    "allow_mixed",
    is_flag=True,
    help="compare points run packed (servesweep run --max-parallel) with points run alone; refused without it",
)
def command(
    runs,
    metric_names,
    resamples,
    seed,
    confidence,
    min_effect,
    as_json,
    html_out,
    allow_mixed=False,
    compact=False,
):
    """Compare runs point by point: RUNS[0] is the baseline, each later run is compared with it.

    Points match on configuration and load axes (workload, prompt and output tokens, concurrency). Each metric's
    change comes with a bootstrap confidence interval from the raw records and a verdict: better, worse, within
    noise, or not enough requests to tell (lower latency and higher tok/s are better). A summary line comes
    first."""
    from rich.console import Console

    from servesweep.results import capacity

    if len(runs) < 2:
        raise UsageError("give at least two run folders: BASELINE RUN [RUN ...]")
    try:
        metrics = [metric(n) for n in metric_names] or None
    except ValueError as e:
        raise BadOption(str(e), "--metric") from None
    eff = parse_fraction(min_effect, "--min-effect")
    try:
        loaded = [load_run(r) for r in runs]
        rcs = [
            compare_runs(
                loaded[0], b, metrics, resamples=resamples, seed=seed, confidence=confidence, min_effect=eff
            )
            for b in loaded[1:]
        ]
    except RunError as e:
        click.echo(f"servesweep compare: {e}", err=True)
        sys.exit(2)
    _check_packing(rcs, allow_mixed)
    searched = False if as_json else capacity.print_compares(Console(), runs)
    for rc in rcs:
        if not rc.points and not searched:
            click.echo(
                f"servesweep compare: no matching points between {rc.a.path} and {rc.b.path} "
                f"(baseline has {_few(rc.only_a)}; run has {_few(rc.only_b)})",
                err=True,
            )
            sys.exit(2)
    if html_out is not None:
        write_compare_html(rcs, html_out)
    if as_json:
        click.echo(json.dumps([rc.as_dict() for rc in rcs], indent=2))
    else:
        out = Console()
        for rc in rcs:
            out.print(rc.summary_line(), highlight=False, soft_wrap=True)
            if compact:
                for line in compact_lines(rc)[1:]:
                    out.print(line, highlight=False, soft_wrap=True, markup=False)
            else:
                out.print(rich_table(rc))
                for line in cause_lines(rc):
                    out.print(line, highlight=False, soft_wrap=True, markup=False)
            if rc.only_a or rc.only_b:
                out.print(
                    f"unmatched: baseline only {', '.join(rc.only_a) or '-'}; run only {', '.join(rc.only_b) or '-'}"
                )
        if html_out is not None:
            out.print(f"html: {html_out}")

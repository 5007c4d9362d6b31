"""`servesweep gate RUN`: check a run against SLOs and a baseline (servesweep.results.gates.check_run); print the
verdict (every check with --details or --json, a JUnit file with --junit) and exit with its code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from servesweep.cli.base import HELP, Command
from servesweep.results.gates import check_run


@click.command(cls=Command, context_settings=HELP)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--slo", "slo_texts", multiple=True, help="e.g. 'ttft_p99<=2s' (repeatable; commas also split)")
@click.option("--baseline", type=click.Path(path_type=Path), default=None, help="run folder to compare with")
@click.option("--max-regression", default="10%", show_default=True, help="allowed change for the worse")
@click.option(
    "--regression-metric", "reg_metrics", multiple=True, help="metrics the limit applies to (repeatable)"
)
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="print every check as JSON")
@click.option("--details", is_flag=True, help="print every check before the verdict line")
@click.option("--resamples", type=click.IntRange(100, 100_000), default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--allow-degraded",
    is_flag=True,
    help="accept points measured at a lower load than asked (a lost Locust worker); they are still listed",
)
@click.option(
    "--max-failure-rate",
    default=None,
    help="exit 3 when a point's failed share of requests is above this (5% or 0.05; 100%: only a point with no "
    "success); default: the one the point was measured with (load.max_failure_rate, load --max-failure-rate), else 1%",
)
@click.option(
    "--min-capacity",
    default=None,
    help="a run with a search: block: every capacity at least this load, or this share of --baseline's (90%)",
)
def command(
    run_dir,
    slo_texts,
    baseline,
    max_regression,
    reg_metrics,
    junit_path,
    as_json,
    details,
    resamples,
    seed,
    min_capacity,
    allow_degraded=False,
    max_failure_rate=None,
):
    """Check a run against SLOs (given here, else the experiment's `slo` or those `servesweep load --slo` recorded)
    and a baseline run.

    Exit 0 pass, 1 breach, 2 could not run (a point not measured; a degraded point too: measured at a lower load
    than asked, unless --allow-degraded), 3 too many failed requests (as `servesweep load` and `run`). Prints a
    one-line verdict; --junit writes one testcase per point × check."""
    verdict = check_run(
        run_dir,
        list(slo_texts),
        baseline=baseline,
        max_regression=max_regression,
        reg_metrics=reg_metrics,
        resamples=resamples,
        seed=seed,
        min_capacity=min_capacity,
        allow_degraded=allow_degraded,
        max_failure_rate=max_failure_rate,
    )
    if junit_path is not None:
        verdict.write_junit(junit_path)
    if as_json:
        click.echo(json.dumps(verdict.as_dict(), indent=2))
    elif details:
        for r in verdict.results:
            state = {True: "ok  ", False: "FAIL", None: "skip"}[r.passed]
            click.echo(f"{state} {r.point}  {r.check}: {r.message}")
    click.echo(verdict.line, err=as_json)
    if not as_json:  # under the verdict line, which stays the first to read
        for point, why in (verdict.context.get("why") or {}).items():
            click.echo(f"why {point}: {why}")
    sys.exit(verdict.exit_code)

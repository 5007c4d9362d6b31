"""servesweep's exit codes: one meaning per code for `servesweep load`, `servesweep run`, `servesweep gate` and
plain Locust (`locust -f locustfiles/llm.py --headless`), so a CI job tells a regression from an outage
(docs/reports.md, "Exit codes"). Imports nothing of servesweep: every layer may use it.

When several hold, the one that says least was measured wins: could not run (2), then too many failed requests
(3: the latencies of the rest mean little), then a breach (1).
"""

from __future__ import annotations

import click

PASS = 0
BREACH = 1  # an SLO breached, or a regression against the baseline
# bad input (options, experiment file), the server unreachable or not started, points not measured, or a point
# measured at a lower load than asked (degraded: a Locust worker lost; results/degraded.py): not what was asked
COULD_NOT_RUN = 2
FAILED_REQUESTS = 3  # a point with no success, or a failed share above --max-failure-rate / load.max_failure_rate
# 4 is a process's own: `run`'s results folder full or unwritable; a Locust child whose parent died.


class CouldNotRun(click.ClickException):
    """A command could not measure (`Error: ...` on stderr): exit 2, as click's usage errors, never 1 (a breach)."""

    exit_code = COULD_NOT_RUN

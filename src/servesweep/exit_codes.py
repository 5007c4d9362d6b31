"""servesweep's exit codes: one meaning per code for `servesweep load`, `servesweep run`, `servesweep gate` and
plain Locust (`locust -f locustfiles/llm.py --headless`), so a CI job tells a regression from an outage
(docs/reports.md, "Exit codes"), and the errors the domain modules raise to say they could not do what was asked.
Imports nothing, not even click: every layer may use it. The CLI (servesweep.cli) turns each error into click's
message and this code, in one place (servesweep.cli.base).

When several hold, the one that says least was measured wins: could not run (2), then too many failed requests
(3: the latencies of the rest mean little), then a breach (1).
"""

from __future__ import annotations

PASS = 0
BREACH = 1  # an SLO breached, or a regression against the baseline
# bad input (options, experiment file), the server unreachable or not started, points not measured, or a point
# measured at a lower load than asked (degraded: a Locust worker lost; results/degraded.py): not what was asked
COULD_NOT_RUN = 2
FAILED_REQUESTS = (
    3  # a point with no success, or a failed share above --max-failure-rate / load.max_failure_rate
)
# 4 is a process's own: `run`'s results folder full or unwritable; a Locust child whose parent died.


class CommandError(Exception):
    """A command stopped: `Error: <message>` on stderr and exit 1, as click's own ClickException (the commands
    that used to raise that: `prompts`, `trace`, `observe`, `sglang-cpu`)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CouldNotRun(CommandError):
    """A command could not measure (`Error: ...` on stderr): exit 2, as click's usage errors, never 1 (a breach)."""

    exit_code = COULD_NOT_RUN


class UsageError(CouldNotRun):
    """The options do not go together: the command's usage line, then `Error: <message>`; exit 2."""


class BadOption(UsageError):
    """One option's value is wrong: `Error: Invalid value for <option>: <message>` under the usage line; exit 2."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option

    def __str__(self) -> str:
        return f"Invalid value for {self.option}: {self.message}"  # click's wording of a bad parameter

"""One Locust run in this (gevent-patched) process, as `locust -f locustfiles/llm.py ARGS` runs it.

`LocalRun` follows `locust.main.main` for a local runner, step by step and with Locust's own functions: options
from Locust's parser (servesweep's arguments come from the locustfile's init_command_line_parser listener), the
Environment from `locust.main.create_environment`, the local runner, the web UI (not served: requests go to its
Flask app), the init event, the headless or --autostart start, the CSV writer, and the shutdown (quitting event, the
exit status by main's rule, quit event). Only the process around it is left out, so a run costs its load alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import gevent
import locust
import locust.log
from locust import stats
from locust.argument_parser import get_parser
from locust.main import create_environment

# What locustfiles/llm.py imports, in its order: the web UI module first (it changes which options exist).
from servesweep.client import webui  # noqa: F401
from servesweep.client.locustfile import LLMUser

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "locustfiles" / "llm.py"


class LocalRun:
    def __init__(self, *argv: str, web_ui: bool = False) -> None:
        # The process's own command line, as `locust` would have it: Locust's web UI parses sys.argv again for the
        # start form's extra options, and the locustfile reads it (--point-json). The conftest restores it.
        sys.argv = ["locust", "-f", str(LOCUSTFILE), *argv]
        self.opts = get_parser().parse_args(sys.argv[1:])
        self.env = create_environment(
            [LLMUser],
            self.opts,
            events=locust.events,
            locustfile=LOCUSTFILE.name,
            parsed_locustfiles=[str(LOCUSTFILE)],
            available_user_classes={"LLMUser": LLMUser},
            available_shape_classes={},
            available_user_tasks={"LLMUser": LLMUser.tasks},
        )
        self.runner = self.env.create_local_runner()
        self.csv_writer = None
        if self.opts.csv_prefix:
            self.csv_writer = stats.StatsCSVFileWriter(
                self.env, stats.PERCENTILES_TO_REPORT, self.opts.csv_prefix, self.opts.stats_history_enabled
            )
        self.web_ui = None
        if web_ui and not self.opts.headless:
            self.web_ui = self.env.create_web_ui(
                host="127.0.0.1", port=0, delayed_start=True, stats_csv_writer=self.csv_writer
            )
        self.env.events.init.fire(environment=self.env, runner=self.runner, web_ui=self.web_ui)
        # main: an exception in an init handler is fatal (exit 1)
        assert not locust.log.unhandled_greenlet_exception, "an init listener raised (see the log)"
        if self.csv_writer is not None:
            gevent.spawn(self.csv_writer.stats_writer)
        self.exit_code: int | None = None

    def get(self, path: str):
        """A GET on the web UI's Flask app (what the browser or a poller would fetch)."""
        assert self.web_ui is not None
        return self.web_ui.app.test_client().get(path)

    def start(self, run_time: float | None = None) -> None:
        """main's start_automatic_run: the shape, or -u users at -r; -t (or `run_time`, which may be fractional
        here: Locust's -t takes whole seconds) quits the runner, which stops the users within --stop-timeout."""
        o = self.opts
        if o.num_users is None:
            o.num_users = 1
        if o.spawn_rate is None:
            o.spawn_rate = 1
        if self.env.shape_class:
            self.runner.start_shape()
        else:
            gevent.spawn(self.runner.start, o.num_users, o.spawn_rate)
        run_time = run_time if run_time is not None else o.run_time
        if run_time:
            gevent.spawn_later(run_time, self.runner.quit)

    def wait(self, timeout: float) -> None:
        """Until the runner's greenlets are gone (a quit: the budget, -t, the point's own end), as main joins them."""
        self.runner.greenlet.join(timeout=timeout)
        if len(self.runner.greenlet):  # greenlets leave their group when they end
            self.runner.quit()
            raise AssertionError(f"the run did not end within {timeout} s (state {self.runner.state})")

    def wait_shape(self, timeout: float) -> None:
        """--autostart with a shape: main joins the shape greenlet, then stops the test (no --autoquit here)."""
        g = self.runner.shape_greenlet
        if g is not None:
            g.join(timeout=timeout)
        if g is not None and not g.dead:
            raise AssertionError(f"the shape did not end within {timeout} s")
        self.runner.stop()

    def shutdown(self) -> int:
        """main's shutdown(): the quitting event, then the exit status: environment.process_exit_code when set,
        else --exit-code-on-error when any request failed or a task raised, else 2 after an unhandled greenlet
        exception, else 0."""
        self.env.events.quitting.fire(environment=self.env, reverse=True)
        if self.env.process_exit_code is not None:
            code = self.env.process_exit_code
        elif len(self.runner.errors) or len(self.runner.exceptions):
            code = self.opts.exit_code_on_error
        elif locust.log.unhandled_greenlet_exception:
            code = 2
        else:
            code = 0
        self.runner.quit()
        self.env.events.quit.fire(exit_code=code)
        if self.csv_writer is not None:
            self.csv_writer.close_files()
        self.exit_code = code
        return code

    def run(self, timeout: float = 60.0, run_time: float | None = None) -> int:
        """A headless run from start to exit status."""
        self.start(run_time)
        self.wait(timeout)
        return self.shutdown()


def wait_until(cond: Callable[[], object], timeout: float, what: str, period: float = 0.1):
    """Poll `cond` (patched: other greenlets run meanwhile) until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(period)



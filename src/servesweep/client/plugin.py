"""servesweep inside Locust: the listeners on Locust's events that make a run of one point.

A Locust process loads servesweep through one of two entry files, and the entry says once which it is:
`client/locustfile.py` (what servesweep's runs start: `locust -f <it> --point-json ...`) installs the plain set;
the web UI module (`client/webui.py`, which `locustfiles/llm.py` loads for people) installs it with `ui_module`:
the ramp options and the start form, whose options may change at each start, and its own exporter. At Locust's
init the process's state is made once (`state.ClientState` on `environment.servesweep`: its role, its point, its
load) and every listener reads that state, nothing else.

The modules the listeners call, by concern: options.py (the options, the point from them or from --point-json),
context.py (the point's prompt bodies), share.py (this process's share of the budget and rate; status and progress
files), distributed.py (master and workers), watch.py (parent and master watch), outcome.py (records, gates, exit
codes), clients.py (headroom and per-process counters).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import locust.stats
from locust import events

from servesweep.client import stats_rows
from servesweep.client.clients import Sampler
from servesweep.client.context import Prebuilt, build_context, context_for, prebuild
from servesweep.client.distributed import end_distributed, master_hooks, worker_hooks
from servesweep.client.feed import start_feed
from servesweep.client.options import (
    FOREVER,
    add_arguments,
    locust_options_from_point,
    point_from_options,
    settle_run_time,
    settle_stop_timeout,
)
from servesweep.client.outcome import failure_gate, slo_gate, write_records
from servesweep.client.share import STATUS_DIR_ENV, prepare, progress_loop, write_progress, write_status
from servesweep.client.state import ClientState, Role, client_state, role_of
from servesweep.client.user import LLMUser, LoadContext
from servesweep.client.watch import Lineage, start_watch
from servesweep.exit_codes import COULD_NOT_RUN

log = logging.getLogger("servesweep")


class Plugin:
    """servesweep's listeners, registered on Locust's global events by `install` (once per process)."""

    def __init__(self, ui_module: bool) -> None:
        self.ui_module = ui_module
        self.lineage = Lineage()  # before --processes forks: the parent watch of forked workers needs it
        self.prebuilt: Prebuilt | None = prebuild(sys.argv)

    def register(self) -> None:
        events.init_command_line_parser.add_listener(self.on_parser)
        events.init.add_listener(self.on_init)
        events.test_start.add_listener(self.on_test_start)
        events.test_stopping.add_listener(self.on_test_stopping)
        events.test_stop.add_listener(self.on_test_stop)
        events.quitting.add_listener(self.on_quitting)

    def on_parser(self, parser, **_kw) -> None:
        add_arguments(parser, ui_module=self.ui_module)

    def on_init(self, environment, **_kw) -> None:
        opts = environment.parsed_options
        if opts is None:  # used as a library without options: the caller sets environment.servesweep itself
            return
        role = role_of(environment.runner)
        state = environment.servesweep = ClientState(
            role=role,
            headless=bool(getattr(opts, "headless", False)),
            ui_module=self.ui_module,
            from_point_json=bool(opts.point_json),
            forked=self.lineage.forked(),
        )
        try:
            point = point_from_options(opts, environment.host or opts.host)
            if point is not None and opts.point_json:
                locust_options_from_point(environment, point)
            load = None
            if point is not None and role is not Role.MASTER:
                load = context_for(self.prebuilt, opts.point_json, point)
        except (ValueError, RuntimeError, OSError) as e:
            # Locust logs and ignores exceptions of event handlers; without a load the users would only wait.
            log.error("servesweep: cannot start the point: %s", e)
            print(f"servesweep: COULD NOT RUN: {e}", file=sys.stderr, flush=True)
            raise SystemExit(COULD_NOT_RUN) from None  # bad input: 2, never 1 (a breach)
        state.point = point  # None: a worker's host comes with the first spawn, a UI master's from its form
        if load is not None:
            use_load(environment, state, load)
        settle_stop_timeout(environment, point)
        if role is Role.MASTER:
            state.point = settle_run_time(environment, state.point)
        start_watch(environment, state, self.lineage)
        if role is not Role.MASTER:
            # A load built after test_start (the web UI's start form, or a worker whose init was still building
            # when the first spawn came) is prepared by the first user that runs with it.
            state.prepare = lambda c: prepare(environment, state, c)
        port = getattr(opts, "metrics_port", 0)
        if port and not self.ui_module and role is not Role.WORKER:
            from servesweep.client.exporter_feed import install_locust
            from servesweep.observe.exporter import ClientMetrics
            from servesweep.results.livefeed import RUN_ID_ENV

            # the run's id when servesweep started this process (it registers this exporter for Prometheus)
            state.metrics = ClientMetrics(
                os.environ.get(RUN_ID_ENV) or time.strftime("locust-%Y%m%dT%H%M%SZ", time.gmtime())
            )
            install_locust(environment, state.metrics, serve=("127.0.0.1", port))
        if role is Role.WORKER:
            worker_hooks(environment, state)
        elif role is Role.MASTER:
            master_hooks(environment, state)

    def on_test_start(self, environment, **_kw) -> None:
        import gevent

        state = client_state(environment)
        if state is None:
            return
        opts = environment.parsed_options
        if state.load is None and state.is_worker and not self.ui_module:
            # A worker started without --host: the master's host has arrived with the spawn (the web UI module
            # builds the load itself, from the form's options: webui._apply_form_options).
            point = point_from_options(opts, environment.host)
            if point is not None:
                use_load(environment, state, build_context(point))
        if state.feed is None:  # the parent's live view of the records, when it asked for one
            state.feed = start_feed(lambda: state.buffer, worker=state.is_worker)
        if state.is_master:
            # The master merges every record: its CPU is what limits many workers.
            state.sampler = sampler = Sampler(environment.runner)
            gevent.spawn(sampler.run)
            pt = state.point
            d = pt.duration_s if pt is not None else None
            if pt is not None and d is not None and d < FOREVER and state.headless:
                gevent.spawn_later(pt.warmup_s + d, end_distributed, environment, state)
            return
        load = state.load
        if load is None:
            return
        load.closing = False  # a new start in the web UI after a stop
        load.measure_start_ns = time.monotonic_ns() + int(load.point.warmup_s * 1e9)
        prepare(environment, state, load)
        if opts is not None and opts.progress_file:
            gevent.spawn(progress_loop, load, Path(opts.progress_file))
        d = load.point.duration_s
        if d is not None and d < FOREVER and state.role is Role.LOCAL:
            # Like Locust's -t (which takes whole seconds): quit() stops users gracefully within --stop-timeout,
            # so streams running at the end finish and are recorded.
            gevent.spawn_later(load.point.warmup_s + d, environment.runner.quit)

    def on_test_stopping(self, environment, **_kw) -> None:
        """A graceful stop (-t with a stop timeout, the UI's stop): the streams running finish, no new one starts (an
        open-loop user waiting for its slot would otherwise send once more and hold the stop up)."""
        state = client_state(environment)
        if state is not None and state.load is not None:
            state.load.closing = True

    def on_test_stop(self, environment, **_kw) -> None:
        state = client_state(environment)
        if state is None or state.is_worker:
            return
        opts = environment.parsed_options
        if state.load is not None and opts is not None and opts.progress_file:
            write_progress(state.load, Path(opts.progress_file))
        path = write_records(environment, state)
        if path is not None:
            log.info("servesweep: %d records written to %s", len(state.buffer), path)
        if path is not None and state.is_master:
            # Workers ship what finished during the stop with their next reports: write again once those are in
            # (the UI's master may not quit for a long time; a headless one writes again at quit as well).
            import gevent
            from locust.runners import WORKER_REPORT_INTERVAL

            gevent.spawn_later(WORKER_REPORT_INTERVAL + 1.0, write_records, environment, state)

    def on_quitting(self, environment, **_kw) -> None:
        state = client_state(environment)
        if state is None:
            return
        status_dir = os.environ.get(STATUS_DIR_ENV)
        if status_dir and state.load is not None:
            write_status(state.load, Path(status_dir) / f"{os.getpid()}.json", quit=True)
        if state.is_worker:
            return
        write_records(environment, state)  # again: the master may have received the workers' final reports
        opts = environment.parsed_options
        if opts is None or state.abandoned:
            return  # EXIT_PARENT_GONE stands
        slo_gate(environment, state, opts)
        failure_gate(environment, state, opts)


def use_load(environment: Any, state: ClientState, load: LoadContext) -> None:
    """The users of this process run with `load` (its point's host and timeouts)."""
    opts = environment.parsed_options
    LLMUser.host = load.point.base_url
    LLMUser.connection_timeout = load.point.connect_s
    LLMUser.network_timeout = load.point.first_token_s
    if getattr(opts, "csv_prefix", None):
        load.quit_delay_s = 1.2  # Locust rewrites its CSV once a second and not at exit
    state.load = load
    state.point = load.point
    # Everything built so far (Locust, the tokenizer, the bodies) lives for the whole run: keep it out of the
    # collector's generations so a full collection during the run does not walk it (a pause is a late stamp).
    gc.freeze()
    log.info(
        "servesweep: point %s, model %s, %d prompt bodies, nonce %d digits",
        load.point.id,
        load.point.model,
        len(load.bodies),
        load.nonce_digits,
    )


_INSTALLED: list[Plugin] = []


def install(*, ui_module: bool) -> Plugin:
    """Register servesweep on Locust's events, once per process (the entry file calls it when Locust imports it),
    and switch Locust's statistics to what servesweep measures: percentiles from 1 ms buckets instead of Locust's
    coarse ones (10 ms below 1 s, 1 s above 10 s; bucketing happens where the value is logged, so every process
    patches it), and the LLM TTFT/E2E rows kept out of the Aggregated row (stats_rows). A second call with the other
    `ui_module` is an error: a process is either servesweep's plain run or the web UI's."""
    if _INSTALLED:
        if _INSTALLED[0].ui_module != ui_module:
            raise RuntimeError(
                "servesweep: load either servesweep.client.locustfile (plain runs) or servesweep.client.webui "
                "(locustfiles/llm.py: the web UI), not both"
            )
        return _INSTALLED[0]
    locust.stats.bucket_response_time = lambda response_time: int(round(response_time))
    stats_rows.install()
    plugin = Plugin(ui_module)
    plugin.register()
    _INSTALLED.append(plugin)
    return plugin

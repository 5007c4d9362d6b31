"""A process's share of the point (worker i of N: its part of the request budget and of the arrival rate), set up
once per load at the test start, with its headroom sampler and the files the parent reads while it runs
(status: `SERVESWEEP_STATUS_DIR/<pid>.json` 4x a second; progress: --progress-file once a second)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from servesweep.client.clients import Sampler, counters
from servesweep.client.locust_internals import send_stats_now
from servesweep.client.options import FOREVER
from servesweep.client.state import ClientState
from servesweep.client.user import LoadContext
from servesweep.files import write_atomic

log = logging.getLogger("servesweep")

STATUS_DIR_ENV = "SERVESWEEP_STATUS_DIR"  # run_point: each process writes <dir>/<pid>.json 4x a second


def prepare(environment: Any, state: ClientState, ctx: LoadContext) -> None:
    """Once per load at the test start: its share of budget and rate, its headroom sampler, its status file."""
    import gevent

    if ctx.prepared:
        return
    ctx.prepared = True
    split(environment, state, ctx, time.monotonic_ns())
    state.sampler = sampler = Sampler(environment.runner)
    gevent.spawn(sampler.run)
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:
        gevent.spawn(_status_loop, ctx, Path(status_dir) / f"{os.getpid()}.json")


def split(environment: Any, state: ClientState, ctx: LoadContext, now: int) -> None:
    """This process's share of the point: worker i of N (Locust's worker index; N from --split-workers, which the
    master hands to every worker) gets its part of the request budget and rate/N of the arrivals."""
    from servesweep.workload.arrivals import Arrivals, split_budget

    p = ctx.point
    opts = environment.parsed_options
    runner = environment.runner
    split_n = int(getattr(opts, "split_workers", 0) or 0)
    count, index = 1, 0
    if state.is_worker:
        # By hand (no --split-workers): the master's --expect-workers, which Locust hands to its workers too.
        count = max(1, split_n or int(getattr(opts, "expect_workers", 1) or 1))
        index = runner.worker_index
        if not split_n and not 0 <= index < count:
            log.warning(
                "servesweep: worker index %d but --expect-workers %d: this worker takes the whole budget and rate "
                "(give the master --split-workers N)",
                index,
                count,
            )
            count, index = 1, 0
    if not 0 <= index < count:
        # A worker that joined beyond the expected count (or reconnected): no share of budget or rate.
        log.error(
            "servesweep: worker index %d outside the %d expected workers; it sends nothing", index, count
        )
        ctx.budget = 0
        ctx.end_ns = 1
        index, count = 0, 1
    elif ctx.trace is not None:
        # A trace replay: this process's starts (whole sessions on one worker, by a stable hash of their id), its
        # budget the requests they hold (the trace's, whatever the point's `requests`). The schedule starts when the
        # first user asks for a start, as the open loop's does.
        ctx.trace_schedule = ctx.trace.schedule(index, count, start_ns=None)
        ctx.budget = sum(len(s.indices) for s in ctx.trace_schedule.starts)
    elif p.requests is not None and count > 1:
        ctx.budget = split_budget(p.requests, index, count)
    loop = "closed loop"
    if ctx.trace is not None:
        loop = f"trace replay at {ctx.trace.speed_up:g}x, {len(ctx.trace_schedule or ())} starts"
    elif p.arrival != "closed":
        assert p.rate_rps is not None  # LoadPoint: an open loop has a rate
        loop = f"{p.arrival} at {p.rate_rps / count:g}/s"
        if p.duration_s is not None and p.duration_s < FOREVER:
            ctx.end_ns = ctx.end_ns or now + int((p.warmup_s + p.duration_s) * 1e9)
        # The schedule starts when the first user asks for a slot: slots that came while Locust was still spawning
        # the users would only show as lag of the first requests.
        ctx.arrivals = Arrivals(p.arrival, p.rate_rps, seed=p.seed, index=index, count=count, start_ns=None)
    if state.is_worker:

        def _done() -> None:
            # The share is complete: ship every record now (the regular report may be 3 s away), then leave; the
            # master ends the point when its last worker has quit.
            send_stats_now(runner)
            runner.quit()

        ctx.on_budget_done = _done
    if ctx.trace is not None and ctx.budget == 0 and not ctx.quit_requested:
        # no session of the trace hashed to this worker: nothing will complete, so leave now
        import gevent

        ctx.quit_requested = True
        gevent.spawn_later(ctx.quit_delay_s, ctx.on_budget_done or runner.quit)
    log.info("servesweep: worker %d of %d: budget %s, %s", index, count, ctx.share(), loop)


def _status_loop(ctx: LoadContext, path: Path) -> None:
    import gevent

    while True:
        write_status(ctx, path)
        gevent.sleep(0.25)  # what a killed process leaves is at most 0.25 s old


def write_status(ctx: LoadContext, path: Path, **extra) -> None:
    write_atomic(path, json.dumps({**counters(ctx), "unix": time.time(), **extra}), durable=False)


def progress_loop(ctx: LoadContext, path: Path) -> None:
    import gevent

    while True:
        write_progress(ctx, path)
        gevent.sleep(1.0)


def write_progress(ctx: LoadContext, path: Path) -> None:
    write_atomic(
        path,
        json.dumps(
            {
                "issued": ctx.issued,
                "completed": ctx.completed,
                "failed": ctx.failed,
                "streamed_events": ctx.streamed_events,
            }
        ),
        durable=False,
    )

"""Load shapes and steps: a step ramp over a concurrency list, and per-step summaries of any run.

A *step* is a stretch of time at one user count: it opens when Locust reports spawning complete at that count and
closes when the target count changes or the test stops. Steps come from the `StepRamp` shape or from a person
changing the user count in the web UI by hand; either way each step gets the summary `servesweep load` prints for
a point (same columns, same cells), computed exactly from the per-request records of the requests *scheduled* inside the step
(requests scheduled while users were still spawning belong to no step).

    locust -f locustfiles/llm.py --host http://127.0.0.1:30000 --load-shape step-ramp \
        --ramp-steps 1,2,4,8,16,32,64,100 --ramp-hold 60

or pick "step-ramp" in the start form's `load_shape` field.
"""

from __future__ import annotations

import csv
import io
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from locust import LoadTestShape

if TYPE_CHECKING:
    from gevent import Greenlet

log = logging.getLogger("servesweep")

DEFAULT_STEPS = "1,2,4,8,16,32,64,100"
SHAPES = ("manual", "step-ramp")


def step_columns() -> list[str]:
    """'step', the columns of `servesweep load`'s table (servesweep.results.table.results_table), the step's time."""
    from servesweep.results.table import results_table

    return ["step", *(c.header for c in results_table([]).columns), "start_utc", "duration_s"]


def add_ramp_arguments(parser) -> None:
    """The step ramp's options, in the load shape group of the start form; the locustfile adds them first, with
    the web UI (its parameters show in the order they are added)."""

    def opt(*a, ui=True, help: str, **kw):
        parser.add_argument(*a, include_in_web_ui=ui, help=f"[load shape] {help} ({a[0]})", **kw)

    opt(
        "--load-shape",
        default="manual",
        choices=list(SHAPES),
        help="manual: the user count of the form (change it while running); step-ramp: --ramp-steps",
    )
    opt(
        "--ramp-steps",
        default=DEFAULT_STEPS,
        help="step-ramp: user counts, comma-separated, each held --ramp-hold s",
    )
    opt(
        "--ramp-hold",
        type=float,
        default=60.0,
        help="step-ramp: seconds each step is held once all its users run",
    )
    opt(
        "--ramp-spawn-rate",
        type=float,
        default=0.0,
        help="step-ramp: users started per second between steps (0: each step's users within a second)",
    )
    opt("--steps-csv", default="", ui=False, help="write the per-step summary CSV here when the test stops")


def parse_steps(text: str, where: str = "--ramp-steps") -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; an error names the bad item and where it came from."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{where}: {part!r} in {text!r} is not a positive integer user count")
        out.append(int(part))
    if not out:
        raise ValueError(f"{where}: give at least one user count, e.g. {DEFAULT_STEPS}")
    return out


def check_ramp_options(opts, where: str = "options") -> None:
    """Raise ValueError naming the option when the step-ramp options do not make a ramp."""
    parse_steps(opts.ramp_steps, f"{where} ramp_steps")
    if not float(opts.ramp_hold) > 0:
        raise ValueError(f"{where} ramp_hold: {opts.ramp_hold!r} must be > 0 seconds")
    if float(opts.ramp_spawn_rate) < 0:
        raise ValueError(f"{where} ramp_spawn_rate: {opts.ramp_spawn_rate!r} must be >= 0")


# ---------------------------------------------------------------- steps


@dataclass
class Step:
    index: int
    concurrency: int
    start_ns: int  # wall clock (Unix ns), when spawning completed
    end_ns: int | None = None  # None while open
    start_perf: float = 0.0  # perf_counter at start (the shape's clock)


class StepLog:
    """The steps of the current test on the master (or local runner); reset at each test start."""

    POLL_S = 0.2

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._greenlet: Greenlet | None = None
        self._runner = None

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps and self.steps[-1].end_ns is None else None

    def open(self, concurrency: int) -> None:
        self.close()
        self.steps.append(
            Step(len(self.steps) + 1, int(concurrency), time.time_ns(), None, time.perf_counter())
        )

    def close(self) -> None:
        cur = self.current
        if cur is not None:
            cur.end_ns = time.time_ns()

    def reset(self) -> None:
        self.steps = []

    def attach(self, environment) -> None:
        """Open steps at spawning complete; close them when the target changes or the test stops."""
        import gevent

        self._runner = environment.runner
        ev = environment.events
        ev.test_start.add_listener(lambda **_k: self.reset())
        ev.spawning_complete.add_listener(lambda user_count, **_k: self.open(user_count))
        ev.test_stopping.add_listener(lambda **_k: self.close())
        ev.test_stop.add_listener(lambda **_k: self.close())
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._watch)

    def _watch(self) -> None:
        # A new target (the form's Edit, or the shape's next step) ends the step at once, not when the new
        # count has spawned; nothing else tells us the moment a spawn begins. Ends with the process.
        import gevent

        while True:
            gevent.sleep(self.POLL_S)
            cur, r = self.current, self._runner
            if cur is not None and r is not None:
                if r.target_user_count != cur.concurrency or r.state in ("stopping", "stopped", "cleanup"):
                    self.close()


class StepRamp(LoadTestShape):
    """Hold each user count of --ramp-steps for --ramp-hold seconds (counted from spawning complete), then stop."""

    # Locust instantiates shape classes it finds in a locustfile with no arguments and then always uses them;
    # this one is chosen per run (form or --load-shape) and built by servesweep.client.webui, so it stays hidden.
    abstract = True

    def __init__(self, environment, steplog: StepLog) -> None:
        super().__init__()
        self.environment = environment
        self.steplog = steplog
        self.runner = environment.runner
        self._plan()

    def _plan(self) -> None:
        o = self.environment.parsed_options
        check_ramp_options(o)
        self.steps = parse_steps(o.ramp_steps)
        self.hold_s = float(o.ramp_hold)
        self.spawn_rate = float(o.ramp_spawn_rate)
        self._i = 0
        self._since: float | None = None

    def reset_time(self) -> None:
        super().reset_time()
        self._plan()  # options may have come from the start form since

    def _rate(self, i: int) -> float:
        if self.spawn_rate > 0:
            return self.spawn_rate
        prev = self.steps[i - 1] if i else 0
        return float(max(1, abs(self.steps[i] - prev)))

    def tick(self):
        c = self.steps[self._i]
        if self._since is None:
            cur = self.steplog.current
            if cur is not None and cur.concurrency == c:
                self._since = cur.start_perf
        if self._since is not None and time.perf_counter() - self._since >= self.hold_s:
            self._i += 1
            self._since = None
            if self._i >= len(self.steps):
                return None
            c = self.steps[self._i]
        return (c, self._rate(self._i))


# ---------------------------------------------------------------- per-step summaries


class StepSummarizer:
    """Per-step summaries from a growing record buffer, without redoing what did not change.

    The buffer (a RecordBuffer on the master or local runner, only ever appended to) is turned into Arrow a new
    slice at a time, and a step is summarized again only when the number of its records or its end changed, so a
    refresh costs the new records plus the steps that got some (a step's last requests arrive up to a request's
    length after it ended).
    """

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._buf = None
        self._rows = 0
        self._tables: list = []
        self._walls: list = []
        self._cache: dict[int, tuple[tuple, dict]] = {}

    def _update(self, buf) -> None:
        import numpy as np

        from servesweep.results.records import columns_to_table

        if buf is not self._buf:
            self._clear()
            self._buf = buf
        cols, n = buf.columns_since(self._rows)
        if n > self._rows:
            t = columns_to_table(cols)
            self._tables.append(t)
            sched = t.column("scheduled_ns").to_numpy(zero_copy_only=False).astype(np.int64)
            off = t.column("mono_to_wall_ns").to_numpy(zero_copy_only=False).astype(np.int64)
            self._walls.append(sched + off)
            self._rows = n
            if len(self._tables) > 64:  # keep the pieces few: concat is cheap, Arrow keeps the chunks
                import pyarrow as pa

                self._tables = [pa.concat_tables(self._tables)]
                self._walls = [np.concatenate(self._walls)]

    def summaries(self, buf, steps: list[Step], include_open: bool = True) -> list[dict]:
        """summary.summarize() of each step's records (scheduled within the step), with `point.concurrency`."""
        import numpy as np
        import pyarrow as pa

        from servesweep.results.records import columns_to_table
        from servesweep.results.summary import summarize

        self._update(buf)
        table = pa.concat_tables(self._tables) if self._tables else columns_to_table({})
        wall = np.concatenate(self._walls) if self._walls else np.zeros(0, np.int64)
        now = time.time_ns()
        out = []
        for st in steps:
            if st.end_ns is None and not include_open:
                continue
            end = st.end_ns if st.end_ns is not None else now
            mask = (wall >= st.start_ns) & (wall < end)
            key = (int(mask.sum()), st.end_ns)
            hit = self._cache.get(st.index)
            if hit is not None and hit[0] == key and st.end_ns is not None:
                s = hit[1]
            else:
                s = summarize(table.filter(pa.array(mask)))
                s["point"] = {"concurrency": st.concurrency}
                self._cache[st.index] = (key, s)
            s["step"] = {
                "index": st.index,
                "start_ns": st.start_ns,
                "end_ns": st.end_ns,
                "duration_s": (end - st.start_ns) / 1e9,
            }
            out.append(s)
        return out


def step_rows(summaries: list[dict]) -> list[list[str]]:
    """Each step as a row under step_columns(): the load table's cells as `servesweep load` prints them."""
    from servesweep.results.table import results_table

    table = results_table(summaries)
    cells = [[str(c) for c in col.cells] for col in table.columns]
    rows = []
    for i, s in enumerate(summaries):
        st = s["step"]
        rows.append(
            [
                str(st["index"]),
                *(col[i] for col in cells),
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st["start_ns"] / 1e9)),
                f"{st['duration_s']:.3f}",
            ]
        )
    return rows


def steps_csv(summaries: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(step_columns())
    w.writerows(step_rows(summaries))
    return buf.getvalue()

"""What a Locust process knows about the processes that generate load: its own CPU time and event-loop lag
(`Sampler`), and on the master (or a local runner, of itself) each process's counters, headroom and exit status
(`Clients`, written to clients.json beside the records)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep.client.locust_internals import forked_worker_exits

if TYPE_CHECKING:
    from servesweep.client.user import LoadContext


class Clients:
    """What the master (or a local runner, of itself) knows about each load-generating process: its last counters,
    its CPU time, every event-loop lag sample, and the last state Locust gave it (`missing`: heartbeats stopped)."""

    MAX_LAGS = 200_000  # 20 samples a second: nearly 3 hours per process

    def __init__(self) -> None:
        self.by_id: dict[str, dict] = {}
        self.exits: dict[int, int] = {}  # forked local worker pid -> exit status (a signal N as 128 + N)

    def _entry(self, client_id: str) -> dict:
        return self.by_id.setdefault(client_id, {"client_id": client_id, "lags_ms": [], "cpu_pct_max": 0.0})

    def update(self, client_id: str, st: dict) -> None:
        c = self._entry(client_id)
        lags = st.get("lags_ms") or ()
        if len(c["lags_ms"]) < self.MAX_LAGS:
            c["lags_ms"].extend(lags)
        for k in ("worker", "pid", "issued", "completed", "failed", "cpu_s", "wall_s", "role"):
            if k in st:
                c[k] = st[k]
        c["cpu_pct_max"] = max(c["cpu_pct_max"], float(st.get("cpu_pct_max") or 0.0))
        c["shipped"] = c.get("shipped", 0) + int(st.get("shipped", 0))

    def state(self, client_id: str, state: str) -> None:
        c = self._entry(client_id)
        c["last_state"] = state
        if state == "missing":
            c["missing"] = True

    def note_exits(self) -> None:
        """Exit statuses of the worker processes Locust forked (--processes). gevent's child watcher reaps them as
        they end and keeps (pid, status, time) until they are waited for (locust_internals.forked_worker_exits); Locust
        waits only at its own exit, so peek there (read only: a wait of ours would break Locust's)."""
        for pid, v in forked_worker_exits().items():
            if isinstance(v, tuple) and pid not in self.exits:
                code = os.waitstatus_to_exitcode(v[1])
                self.exits[pid] = 128 - code if code < 0 else code  # as a shell says it: SIGKILL is 137

    def write(self, path: Path) -> None:
        """clients.json through its model (results/summary.py ClientsFile): checked, versioned, atomic."""
        from servesweep.results.summary import ClientsFile

        ClientsFile.save_data(path, {"clients": list(self.by_id.values()), "worker_exits": self.exits})


class Sampler:
    """This process's CPU time and event-loop lag (how late a 50 ms gevent sleep wakes up) since the test start, and
    its busiest 3-second CPU window."""

    PERIOD_S = 0.05
    WINDOW_S = 3.0

    def __init__(self, runner: Any = None) -> None:
        self.cpu0 = time.process_time()
        self.wall0 = time.monotonic()
        self.lags_ms: list[float] = []
        self.cpu_pct_max = 0.0
        # Lag is not sampled while the runner spawns users (all at once: one stall before any load).
        self._runner = runner

    def run(self) -> None:
        import gevent

        period, clock, cpu = self.PERIOD_S, time.monotonic, time.process_time
        w_wall, w_cpu = clock(), cpu()
        while True:
            t0 = clock()
            gevent.sleep(period)
            t1 = clock()
            spawning = self._runner is not None and self._runner.state == "spawning"
            if len(self.lags_ms) < Clients.MAX_LAGS and not spawning:
                self.lags_ms.append((t1 - t0 - period) * 1000.0)
            if t1 - w_wall >= self.WINDOW_S:
                c = cpu()
                self.cpu_pct_max = max(self.cpu_pct_max, (c - w_cpu) / (t1 - w_wall) * 100.0)
                w_wall, w_cpu = t1, c

    def take(self, reset: bool = True) -> dict:
        lags = self.lags_ms
        if reset:
            self.lags_ms = []
        return {
            "cpu_s": time.process_time() - self.cpu0,
            "wall_s": time.monotonic() - self.wall0,
            "cpu_pct_max": self.cpu_pct_max,
            "lags_ms": list(lags),
        }


def counters(ctx: LoadContext) -> dict:
    """This process's name and request counters, as clients.json and the status files show them."""
    return {
        "worker": ctx.worker,
        "pid": os.getpid(),
        "issued": ctx.issued,
        "completed": ctx.completed,
        "failed": ctx.failed,
        "streamed_events": ctx.streamed_events,
    }


def client_status(ctx: LoadContext, sampler: Sampler | None, shipped: int = 0, reset: bool = True) -> dict:
    d = {**counters(ctx), "shipped": shipped}
    if sampler is not None:
        d.update(sampler.take(reset))
    return d

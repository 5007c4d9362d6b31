"""The Locust command line of one point: a headless Locust process (alone, or with local worker processes), or a
master for workers on other hosts. `run_point` (driver/point.py) starts it; the remote workers' role
(driver/workers.py) starts the workers that join the master.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from servesweep.config.point import LoadPoint
from servesweep.net import free_port

LOCUSTFILE = Path(__file__).resolve().parents[1] / "client" / "locustfile.py"


def locust_command(point: LoadPoint, work: Path, *, workers: int = 0) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--host",
        point.base_url,
        "-u",
        str(point.concurrency),
        "-r",
        str(max(point.concurrency, 1000)),  # all users within ~0.1 s: a closed loop at full concurrency
        "--stop-timeout",
        str(math.ceil(point.effective_stop_timeout())),  # Locust takes whole seconds
        "--exit-code-on-error",
        "0",  # failures are data (classified in the records), not a crashed point
        "--only-summary",
        "--html",
        str(work / "locust-report.html"),
        "--point-json",
        str(work / "point.json"),
        "--records",
        str(work / "records.parquet"),
        "--progress-file",
        str(work / "progress.json"),
    ]
    # No -t: Locust takes whole seconds only; the locustfile ends a duration point itself, to the millisecond.
    if workers:
        # The master ends a duration point (whole seconds: Locust's -t); workers finish their streams within
        # --stop-timeout and ship their records with their last report. A request budget is split between the
        # workers; each quits when its share is done, and the master with the last one.
        cmd += ["--processes", str(workers), "--split-workers", str(workers), *run_time_args(point)]
        # The forked workers find their master at --master-host/--master-port (default 127.0.0.1:5557): a free
        # port of loopback instead, so that points of parallel runs (or tests) do not meet at 5557.
        port = str(free_port())
        cmd += ["--master-bind-host", "127.0.0.1", "--master-bind-port", port, "--master-port", port]
    return cmd


def run_time_args(point: LoadPoint) -> list[str]:
    """Locust's -t for a master: only a backstop. The locustfile ends a duration point itself when its time is up
    (the workers finish their streams and ship every record, then the master quits); -t, which would quit the
    master before those records arrive, comes a stop timeout and a margin later. None for a budget only."""
    if point.duration_s is None:
        return []
    return ["-t", f"{math.ceil(point.warmup_s + point.duration_s + point.effective_stop_timeout() + 30)}s"]


def master_command(
    point,
    work: Path,
    *,
    expect_workers: int,
    bind_host: str,
    bind_port: int,
    max_wait_s: float = 120,
) -> list[str]:
    """The headless Locust master of one point for external workers: run_point's command (same locustfile, point
    file, records) with `--master --expect-workers N` instead of local `--processes`. Locust's -t ends a duration
    point (whole seconds); the workers finish their streams within --stop-timeout and ship their last records. A
    request budget is split between the workers, and the master ends when the last one has done its share."""
    cmd = locust_command(point, work, workers=0)
    i = cmd.index(
        "--progress-file"
    )  # Locust hands the master's custom arguments to every worker: keep it off
    del cmd[i : i + 2]
    return [
        *cmd,
        "--master",
        "--master-bind-host",
        bind_host,
        "--master-bind-port",
        str(int(bind_port)),
        "--expect-workers",
        str(int(expect_workers)),
        "--expect-workers-max-wait",
        str(math.ceil(max_wait_s)),
        "--split-workers",  # the request budget and the arrival rate are split between the workers
        str(int(expect_workers)),
        *run_time_args(point),
    ]

"""The Locust command line of one point: a headless Locust process (alone, or with local worker processes), or a
master for workers on other hosts. `run_point` (driver/point_run.py) starts it; the remote workers' role
(driver/workers.py) starts the workers that join the master.

The point reaches Locust once, as the point.json file (--point-json) in the point's work folder. No value of the
point is repeated on the command line: the locustfile sets Locust's own options that carry one (the host, -u, -r,
the stop timeout and a master's -t backstop) from the point at init (client/options.py), where Locust reads them
after. What stays here is what Locust needs before its init, or that is no value of the point: headless, the
worker processes and their master's address, where the files go, and how many workers share the point.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from servesweep.config.point import LoadPoint
from servesweep.net import free_port

LOCUSTFILE = Path(__file__).resolve().parents[1] / "client" / "locustfile.py"


def point_file(point: LoadPoint, work: Path) -> Path:
    """`work`/point.json, which must hold `point` (run_point writes it there first): the child reads the file only,
    so a command for one point with the file of another is refused here instead of running the file's."""
    path = work / "point.json"
    try:
        held = LoadPoint.model_validate_json(path.read_text()).model_dump_json()
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: no point to run ({e}); write the point there first") from None
    if held != point.model_dump_json():
        raise ValueError(f"{path} holds another point than {point.id}: write the point there first")
    return path


def locust_command(point: LoadPoint, work: Path, *, workers: int = 0) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--exit-code-on-error",
        "0",  # failures are data (classified in the records), not a crashed point
        "--only-summary",
        "--html",
        str(work / "locust-report.html"),
        "--point-json",
        str(point_file(point, work)),
        "--records",
        str(work / "records.parquet"),
        "--progress-file",
        str(work / "progress.json"),
    ]
    if workers:
        # A duration point: the master ends it (the locustfile's end, then Locust's -t as a backstop); workers
        # finish their streams within the stop timeout and ship their records with their last report. A request
        # budget is split between the workers; each quits when its share is done, and the master with the last.
        cmd += ["--processes", str(workers), "--split-workers", str(workers)]
        # The forked workers find their master at --master-host/--master-port (default 127.0.0.1:5557): a free
        # port of loopback instead, so that points of parallel runs (or tests) do not meet at 5557.
        port = str(free_port())
        cmd += ["--master-bind-host", "127.0.0.1", "--master-bind-port", port, "--master-port", port]
    return cmd


def master_command(
    point: LoadPoint,
    work: Path,
    *,
    expect_workers: int,
    bind_host: str,
    bind_port: int,
    max_wait_s: float = 120,
) -> list[str]:
    """The headless Locust master of one point for external workers: run_point's command (same locustfile, point
    file, records) with `--master --expect-workers N` instead of local `--processes`. The master ends a duration
    point; the workers finish their streams within the stop timeout and ship their last records. A request budget
    is split between the workers, and the master ends when the last one has done its share."""
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
    ]

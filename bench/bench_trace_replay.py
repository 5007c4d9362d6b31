"""Trace replay's schedule lag: a generated trace at 20 req/s replayed through Locust worker processes.

    .venv/bin/python bench/bench_trace_replay.py [--rate 20] [--duration 30] [--workers 2] [--concurrency 64]
        [--block-size 64] [--sim-speedup 20] [--repeat 1]

A trace of `rate * duration` requests evenly spaced at `rate` req/s (groups of 4 sharing two prefix blocks, one block
and a partial one of their own, blocks of `--block-size` tokens, 16 output tokens: `servesweep.workload.trace.synth`)
(native format) is replayed at speed 1 by `run_point(workers=N)` against the emulator (`--sim-speedup` calibration, ground truth on),
as `servesweep load --workload trace --workers N` does. The requests are small and the emulator fast so that the
server keeps up and the concurrency cap does not bind: the lag measured is the load generator's. Reported per round:

- the aggregate schedule lag (a request's send time minus its trace slot, every request of every worker: the
  summary's `schedule_lag_ms`) p50 / p99 / max, and per worker process p99;
- the emulator's receive time minus the slot (the lag as the server sees it) p50 / p99;
- starts the concurrency cap held back (`cap_bound`: should be 0; a non-zero count means the lag is the cap's);
- the fidelity verdict (expected vs measured cache hits).

The goal (issue 30): aggregate schedule lag p99 <= 5 ms at 20 req/s with 2 workers on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim
from servesweep.workload.trace import synth

MODEL = "Qwen/Qwen3.6-27B"


def _pct(a) -> dict | None:
    a = np.asarray(a, dtype=np.float64)
    if not a.size:
        return None
    return {
        "p50": round(float(np.percentile(a, 50)), 3),
        "p99": round(float(np.percentile(a, 99)), 3),
        "max": round(float(a.max()), 3),
        "n": int(a.size),
    }


def run_one(sim, tmp: Path, trace: Path, args, k: int) -> dict:
    point = LoadPoint(
        base_url=sim.base_url, model=MODEL, probe=False, concurrency=args.concurrency, requests=1,
        workload="trace", trace=str(trace), seed=k, point_id=f"replay-{k}",
    )  # fmt: skip
    t0 = time.monotonic()
    summary = run_point(point, tmp / f"r{k}", workers=args.workers)
    wall = time.monotonic() - t0
    recs = read_parquet(tmp / f"r{k}" / "records.parquet").to_pylist()
    ids = {r["request_id"] for r in recs}
    gt = {d["id"]: d for d in sim.ground_truth_so_far() if d["id"] in ids}
    lag = [(r["sent_ns"] - r["scheduled_ns"]) / 1e6 for r in recs]
    recv = [(gt[r["request_id"]]["recv_ns"] - r["scheduled_ns"]) / 1e6 for r in recs if r["request_id"] in gt]
    per_worker: dict[str, list[float]] = {}
    for r, x in zip(recs, lag, strict=True):
        per_worker.setdefault(r["worker"], []).append(x)
    f = summary["trace_fidelity"]
    return {
        "requests": len(recs),
        "failed": sum(r["error_class"] is not None for r in recs),
        "schedule_lag_ms": _pct(lag),
        "summary_schedule_lag_ms_p99": (summary.get("schedule_lag_ms") or {}).get("p99"),
        "per_worker_lag_p99_ms": {w: _pct(v)["p99"] for w, v in per_worker.items()},  # type: ignore[index]
        "server_recv_minus_slot_ms": _pct(recv),
        "cap_bound_starts": f.get("cap_bound_starts"),
        "verdict": f["verdict"],
        "wall_s": round(wall, 1),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--sim-speedup", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    env = {
        "python": platform.python_version(),
        "locust": version("locust"),
        "gevent": version("gevent"),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": vars(args),
    }
    print(json.dumps(env))
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as d:
        tmp = Path(d)
        n = int(args.rate * args.duration)
        s = synth.shared_prefix_requests(
            n,
            groups=max(1, n // 4),
            prefix_blocks=2,
            own_blocks=1,
            block_size=args.block_size,
            rate_rps=args.rate,
            output_length=16,
        )
        trace = tmp / "trace.jsonl"
        s.trace.save(trace)  # the native format keeps the block size (Mooncake's is 512)
        sim_args = ["--model-path", MODEL, "--enable-cache-report", "--enable-metrics"]
        sim_args += ["--sim-calibration", f"speedup={args.sim_speedup:g}"]
        with start_sim(sim_args, ground_truth=tmp / "gt.jsonl") as sim:
            for k in range(args.repeat):
                print(json.dumps({"round": k, **run_one(sim, tmp, trace, args, k)}), flush=True)


if __name__ == "__main__":
    main()

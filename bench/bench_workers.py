"""Worker processes: what one Locust worker process sustains, and what two give together.

    .venv/bin/python bench/bench_workers.py [--workers 1,2] [--concurrency-per-worker 8,32] [--duration 10]

For each worker count N and each per-worker concurrency c, one closed-loop duration point runs against the
emulator (`run_point(workers=N)`, concurrency N*c) with its ground truth on. Per worker process it reports:

- streamed chunks and tokens per second it handled, and its CPU per chunk (process CPU time over the point / the
  chunks it recorded; from the per-worker headroom servesweep puts in summary.json);
- its capacity: chunks per CPU-second, i.e. what it sustains with a core to itself. Capacity, not the achieved
  rate, is compared because on this 2-core machine the emulator takes a core's worth of the same CPUs: the
  achieved rate says more about the emulator than about the client;
- its timing error: every chunk's recorded arrival minus the emulator's ground-truth write time (same monotonic
  clock), p50/p99.

The master's CPU (all client CPU, from getrusage of the reaped Locust processes, minus the workers') is reported
per chunk too: it merges every record, so it is what stops scaling when a host has many workers. Aggregate
capacity of N workers = the sum of their capacities; the goal is >= 1.8x one worker, and p99 timing error <= 1 ms
at the load a worker is run at. On a machine with K free cores the same method gives the capacity of K-1 workers
(one core for the master), provided each worker's CPU per chunk stays where it is with one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _pct(a) -> dict | None:
    a = np.asarray(a, dtype=np.float64)
    if not a.size:
        return None
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "n": int(a.size)}


def run_one(sim, tmp: Path, n: int, c: int, args) -> dict:
    point = LoadPoint(
        base_url=sim.base_url,
        model=MODEL,
        probe=False,
        concurrency=n * c,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        duration_s=args.duration,
        point_id=f"w{n}-c{c}",
    )
    out_dir = tmp / f"{point.id}-{time.monotonic_ns()}"
    s = run_point(point, out_dir, workers=n)
    recs = [r for r in read_parquet(out_dir / "records.parquet").to_pylist() if r["error_class"] is None]
    ids = {r["request_id"] for r in recs}
    deadline = time.monotonic() + 15
    while True:  # the emulator flushes its ground truth about once a second
        gt = {d["id"]: d for d in sim.read_ground_truth() if d["id"] in ids}
        if len(gt) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    per: dict[str, dict] = {}
    for r in recs:
        w = per.setdefault(r["worker"], {"chunks": 0, "tokens": 0, "err": [], "unmatched": 0})
        w["chunks"] += len(r["chunk_ns"])
        w["tokens"] += r["completion_tokens"] or 0
        g = gt.get(r["request_id"])
        writes = [ch[0] for ch in g["chunks"]] if g else []
        if len(writes) != len(r["chunk_ns"]):
            w["unmatched"] += 1
            continue
        w["err"].extend((np.asarray(r["chunk_ns"], dtype=np.float64) - writes) / 1e6)
    workers = []
    head = {h["worker"]: h for h in s["client_headroom"]["workers"]}
    for name, w in sorted(per.items()):
        h = head.get(name) or {}
        cpu_s = (h.get("cpu_pct") or 0.0) * (h.get("wall_s") or 0.0) / 100.0
        wall = h.get("wall_s") or s["window_s"]
        workers.append(
            {
                "worker": name,
                "chunks": w["chunks"],
                "chunks_per_s": w["chunks"] / wall,
                "tokens_per_s": w["tokens"] / wall,
                "cpu_pct": h.get("cpu_pct"),
                "cpu_us_per_chunk": cpu_s / w["chunks"] * 1e6 if w["chunks"] else None,
                "capacity_chunks_per_cpu_s": w["chunks"] / cpu_s if cpu_s else None,
                "loop_lag_p99_ms": h.get("loop_lag_p99_ms"),
                "chunk_error_ms": _pct(w["err"]),
                "unmatched_requests": w["unmatched"],
            }
        )
    chunks = sum(w["chunks"] for w in workers)
    m = s["client_headroom"]["master"] or {}
    master_cpu_s = (m.get("cpu_pct") or 0.0) * (m.get("wall_s") or 0.0) / 100.0
    return {
        "workers": n,
        "concurrency_per_worker": c,
        "requests_ok": s["requests"]["ok"],
        "degraded": s["degraded"],
        "output_tokens_per_s": s["output_tokens_per_s"],
        "chunks_per_s": chunks / s["window_s"],
        "per_worker": workers,
        "aggregate_capacity_chunks_per_cpu_s": sum(w["capacity_chunks_per_cpu_s"] or 0 for w in workers),
        "master_cpu_us_per_chunk": master_cpu_s / chunks * 1e6 if chunks else None,
        "chunk_error_ms": _pct(np.concatenate([np.asarray(per[w]["err"]) for w in per]) if per else []),
        "client_saturated": s["client_saturated"],
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=_ints, default=[1, 2], help="worker counts, e.g. 1,2")
    ap.add_argument("--concurrency-per-worker", type=_ints, default=[8, 32])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--speedup", type=float, default=4.0, help="emulator speed (1 = an H200 in real time)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of every configuration (interleaved)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    t0 = time.time()
    runs = []
    sim_args = ["--model-path", MODEL, "--sim-calibration", f"speedup={args.speedup}"]
    with start_sim(sim_args, ground_truth=tmp / "gt.jsonl") as sim:
        for rnd in range(args.repeat):  # interleaved rounds: a busy minute of the machine hits every setting
            for c in args.concurrency_per_worker:
                for n in args.workers:
                    runs.append({"round": rnd, **run_one(sim, tmp, n, c, args)})
                    print(json.dumps(runs[-1]), flush=True)
    scaling, summary = {}, []
    for c in args.concurrency_per_worker:
        base = min(args.workers)
        one = {r["round"]: r for r in runs if r["concurrency_per_worker"] == c and r["workers"] == base}
        for n in args.workers:
            sel = [r for r in runs if r["concurrency_per_worker"] == c and r["workers"] == n]
            ratios = [
                r["aggregate_capacity_chunks_per_cpu_s"]
                / one[r["round"]]["aggregate_capacity_chunks_per_cpu_s"]
                for r in sel
            ]
            scaling.setdefault(str(c), {})[str(n)] = {"median": float(np.median(ratios)), "rounds": ratios}
            pw = [w for r in sel for w in r["per_worker"]]
            summary.append(
                {
                    "workers": n,
                    "concurrency_per_worker": c,
                    "tokens_per_s_per_worker_median": float(np.median([w["tokens_per_s"] for w in pw])),
                    "cpu_us_per_chunk_median": float(np.median([w["cpu_us_per_chunk"] for w in pw])),
                    "chunk_error_p50_ms_median": float(np.median([w["chunk_error_ms"]["p50"] for w in pw])),
                    "chunk_error_p99_ms_median": float(np.median([w["chunk_error_ms"]["p99"] for w in pw])),
                    "chunk_error_p99_ms_best": float(min(w["chunk_error_ms"]["p99"] for w in pw)),
                    "master_cpu_us_per_chunk_median": float(
                        np.median([r["master_cpu_us_per_chunk"] for r in sel])
                    ),
                    "loop_lag_p99_ms_median": float(np.median([w["loop_lag_p99_ms"] or 0 for w in pw])),
                    "load_average_1m": [round(r["load_average_1m"], 1) for r in sel],
                }
            )
    out = {
        "command": "bench/bench_workers.py "
        + " ".join(
            f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
        ),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0)),
        "python": platform.python_version(),
        "locust": version("locust"),
        "gevent": version("gevent"),
        "cpus": os.cpu_count(),
        "capacity_vs_one_worker": scaling,
        "per_setting": summary,
        "wall_s": time.time() - t0,
    }
    print(json.dumps(out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The ONE command for the load generator's performance against its peers, side by side (issue 11).

    .venv/bin/python bench/run_all.py                 # everything: installs peers, ~25 min, writes results
    .venv/bin/python bench/run_all.py --smoke         # servesweep alone, one small point, seconds (CI smoke)
    .venv/bin/python bench/run_all.py --only servesweep,vllm --figures 1,2   # a partial rerun, merged

For every tool and every stream count it starts a FRESH emulator (`servesweep sim`, ground truth on) pinned to
CPU 0 and runs the tool pinned to CPU 1 (`taskset`), so the two do not steal each other's core. Figures:
1. client CPU per streamed chunk over the steady window (see peers/measure.py), at --streams,
2. TTFT and per-chunk arrival error against ground truth (p50/p99 of the absolute error), at --streams,
3. streams per worker process before the per-chunk p99 error exceeds 1 ms: the --streams points plus a finer
   --ladder for the tools that stamp every chunk (--ladder-tools); a tool stops climbing the ladder after two
   points in a row above 1 ms,
4. long context: 100k-token prompts at concurrency 32, client TTFT against ground truth,
5. prompt data for 64 x 100k tokens: servesweep's pool build (fresh process, cold and warm) and every tool's
   launch-to-first-full-size-request in the long-context run,
6. scaling: servesweep with 1 and 2 Locust worker processes (`--workers`, all on the client core), CPU per chunk
   split into master and workers, accuracy, and the projection to larger machines.
A partial rerun (--only/--figures) replaces the matching entries of the last results and re-renders the whole
report (--fresh: start from nothing). Peers run from bench/.peers-venv/<tool> (bench/peers/install.py); a peer
that cannot run is reported with why.
Results: bench/results/peers.md (figures, command, date, machine, versions) and bench/results/raw/*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))


def _frozen_source() -> None:
    """`--src head`: run servesweep (emulator and client) from a copy of the committed sources, so edits in progress
    in the working tree (a shared checkout) cannot change or break it mid-run. Re-executes this script with the
    copy first on PYTHONPATH (before the editable install's path); children inherit it."""
    argv = sys.argv[1:]
    want = any(a == "--src=head" for a in argv) or any(
        a == "--src" and i + 1 < len(argv) and argv[i + 1] == "head" for i, a in enumerate(argv)
    )
    if not want or os.environ.get("SERVESWEEP_BENCH_SRC"):
        return
    root = HERE.parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=root, check=True)
    dest = Path(tempfile.mkdtemp(prefix="ss-bench-src-"))
    archive = subprocess.run(["git", "archive", "HEAD", "src"], capture_output=True, cwd=root, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(dest / "src"), os.environ.get("PYTHONPATH")])),
        SERVESWEEP_BENCH_SRC=f"{dest / 'src'}@{head.stdout.strip()[:12]}",
    )
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


_frozen_source()

import measure  # noqa: E402
import report  # noqa: E402
import tokenizer_dir  # noqa: E402
from runners import EXPERIMENTS, RUNNERS, VENVS, WORKER_RUNNERS, Job  # noqa: E402

from servesweep.sim.launch import start_sim  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# ~20 ms decode steps at 64-256 streams on the H200 profile (weights ~4 ms + 15 ms fixed per step); no EOS before
# max_tokens whether or not a tool sends ignore_eos, so every tool streams the same number of chunks.
DECODE_CAL = "step_overhead_s=0.015,eos_median_tokens=1000000000"
# long context: prefill of 100k tokens sped up 20x so 64 of them fit the time budget; chunks still stream
LONG_CAL = "speedup=20,eos_median_tokens=1000000000"


def sim_args(tok: Path, cal: str, extra: list[str] | None = None) -> list[str]:
    return [
        "--model-path",
        MODEL,
        "--served-model-name",
        "m",
        "--tokenizer-path",
        str(tok),
        "--sim-calibration",
        cal,
        *(extra or []),
    ]


def run_one(runner, job: Job, *args, **kwargs) -> dict:
    """One tool run (see _run_one); an emulator that cannot start is this run's reported failure, not the end of
    the whole benchmark."""
    try:
        return _run_one(runner, job, *args, **kwargs)
    except RuntimeError as e:
        return {
            "tool": runner.name,
            "concurrency": job.concurrency,
            "requests": job.requests,
            "error": str(e)[:600],
        }


def _run_one(
    runner,
    job: Job,
    tok: Path,
    cal: str,
    pin: bool,
    timeout: float,
    sim_extra=None,
    prompt_tokens=None,
    env_extra: dict | None = None,
) -> dict:
    """Fresh emulator, one tool run, all measurements. Never raises for a tool failure: it is a result."""
    job.out.mkdir(parents=True, exist_ok=True)
    gt_path = job.out / "ground_truth.jsonl"
    gt_path.unlink(missing_ok=True)
    res: dict = {
        "tool": runner.name,
        "concurrency": job.concurrency,
        "requests": job.requests,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg_1m": round(os.getloadavg()[0], 2),  # the machine is shared: what else ran at the time
    }
    if prompt_tokens:
        res["prompt_tokens"] = prompt_tokens
    why = runner.available()
    if why:
        return {**res, "error": why}
    with start_sim(
        sim_args(tok, cal, sim_extra),
        ground_truth=gt_path,
        prefix=["taskset", "-c", "0"] if pin else None,
        log_path=job.out / "sim.log",
        timeout=60,
    ) as sim:
        job.base_url = sim.base_url
        cmd = [*(["taskset", "-c", "1"] if pin else []), *runner.command(job)]
        res["command"] = shlex.join(cmd)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OPENAI_API_KEY="none", **runner.env, **(env_extra or {}))
        env.pop("VIRTUAL_ENV", None)
        launched = time.monotonic_ns()
        with open(job.out / "stdout.txt", "wb") as so, open(job.out / "stderr.txt", "wb") as se:
            proc = subprocess.Popen(
                cmd,
                stdout=so,
                stderr=se,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=job.out,
                start_new_session=True,
            )
            cpu = measure.TreeCpu(proc.pid).start()
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                cpu.stop()
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait()
        res["wall_s"] = round((time.monotonic_ns() - launched) / 1e9, 2)
        res["exit_code"] = rc
        time.sleep(0.3)
    gt = measure.read_gt(gt_path)  # the emulator flushed at exit
    stdout = (job.out / "stdout.txt").read_text(errors="replace")
    if rc != 0:
        tail = (job.out / "stderr.txt").read_text(errors="replace")[-1500:] or stdout[-1500:]
        res["error"] = f"exit {rc if rc is not None else f'timeout {timeout:g}s'}: {tail.strip()[-600:]}"
        if not gt:
            return res
    try:
        client = runner.parse(job, stdout)
    except Exception as e:  # a tool's output we cannot read is a reported failure, not a crash of the harness
        res.setdefault("error", f"could not read the tool's per-request output: {type(e).__name__}: {e}")
        client = []
    res["client_requests"] = len(client)
    res["server_requests"] = len(gt)
    res["server_chunks"] = sum(len(g.get("chunks") or ()) for g in gt)
    for k in ("prompt_tokens", "completion_tokens"):  # as the emulator counted them: is the shape the same?
        v = [g[k] for g in gt if g.get(k) is not None]
        res[f"server_{k}_p50"] = int(sorted(v)[len(v) // 2]) if v else None
    gaps = measure.gt_gaps_ms(gt)
    res["emulator_gap_ms"] = measure.pct(gaps, (50, 90, 99)) if gaps.size else None
    firsts = [g["recv_ns"] for g in gt]
    res["launch_to_first_request_s"] = round((min(firsts) - launched) / 1e9, 3) if firsts else None
    res["cpu_total_s"] = round(cpu.total(), 3)
    res["processes_by_depth"] = {
        str(d): sum(1 for x in cpu.depth.values() if x == d) for d in sorted(set(cpu.depth.values()))
    }
    win = measure.steady_window(gt, job.concurrency)
    if win:
        chunks = measure.chunks_between(gt, *win)
        c = cpu.cpu_between(*win)
        res["steady_window_s"] = round((win[1] - win[0]) / 1e9, 2)
        res["steady_chunks"] = chunks
        res["cpu_us_per_chunk"] = round(c / chunks * 1e6, 2) if chunks else None
        res["steady_cpu_util"] = round(c / ((win[1] - win[0]) / 1e9), 3)
        if (
            chunks
        ):  # own CPU per chunk of each level of the client's process tree (e.g. Locust master, workers)
            res["cpu_us_per_chunk_by_depth"] = {
                str(d): round(v / chunks * 1e6, 2) for d, v in sorted(cpu.cpu_by_depth(*win).items())
            }
    score(res, runner, client, gt)
    return res


def score(res: dict, runner, client: list, gt: list[dict]) -> None:
    """Accuracy figures of one run, from the tool's per-request output and the emulator's ground truth."""
    res["max_open_streams"] = measure.max_open(gt)
    target = res.get("prompt_tokens")
    if target and gt and res.get("launch_to_first_request_s") is not None:
        # the first request carrying a full-size prompt (servesweep's probe request is small): data generation
        launched = min(g["recv_ns"] for g in gt) - res["launch_to_first_request_s"] * 1e9
        big = [g["recv_ns"] for g in gt if (g.get("prompt_tokens") or 0) >= 0.5 * target]
        res["launch_to_first_full_prompt_s"] = round((min(big) - launched) / 1e9, 2) if big else None
    ct = sorted(c.ttft_s * 1e3 for c in client)
    st = sorted((g["chunks"][0][0] - g["recv_ns"]) / 1e6 for g in gt if g.get("chunks"))
    res["client_ttft_ms_p50"] = round(ct[len(ct) // 2], 1) if ct else None
    clocks: dict[str, int] = {}
    for c in client:
        if c.clock:
            clocks[c.clock] = clocks.get(c.clock, 0) + 1
    # which clock stamped the chunks: servesweep's records say it per request; peers stamp in user space
    res["clock"] = clocks or {runner.clock: len(client)}
    lags = [c.read_lag_ns / 1e6 for c in client if c.read_lag_ns is not None]
    res["read_lag_ms"] = measure.pct(lags, (50, 99, 100)) if lags else None
    workers = {c.worker for c in client if c.worker}
    if workers:
        res["client_processes_with_records"] = len(workers)
    res["server_ttft_ms_p50"] = round(st[len(st) // 2], 1) if st else None
    for b in runner.pair_by:
        a = measure.accuracy(client, gt, b)
        res[f"acc_{b}"] = {
            "paired": a.paired,
            "unpaired": a.unpaired,
            "ttft_err_ms": measure.pct(a.ttft_err_ms),
            "chunk_err_ms": measure.pct(a.chunk_err_ms),
            "last_chunk_only": not runner.per_chunk,
            "abs_chunk_err_ms": measure.pct(a.abs_chunk_err_ms) if a.abs_chunk_err_ms else None,
            "abs_first_err_ms": measure.pct(a.abs_first_err_ms) if a.abs_first_err_ms else None,
            "abs_later_err_ms": measure.pct(a.abs_later_err_ms) if a.abs_later_err_ms else None,
            # share of requests whose first chunk was stamped > 1 ms off (each shifts all its offsets)
            "first_chunk_over_1ms": round(
                sum(x > 1.0 for x in a.abs_first_err_ms) / len(a.abs_first_err_ms), 4
            )
            if a.abs_first_err_ms
            else None,
        }


def rescore(results: dict, raw: Path) -> None:
    """Recompute the accuracy figures from the files a run left in raw/ (CPU figures stay as measured)."""
    known = {**RUNNERS, **EXPERIMENTS, **WORKER_RUNNERS}
    for kind in ("runs", "long", "workers"):
        for r in results.get(kind, []):
            runner = known[r["tool"]]
            out = raw / _out_name(kind, r["tool"], r["concurrency"])
            if not (out / "ground_truth.jsonl").is_file():
                continue
            job = Job("", "m", Path(), r["concurrency"], r["requests"], 0, 0, out)
            try:
                client = runner.parse(job, (out / "stdout.txt").read_text(errors="replace"))
            except Exception:  # noqa: BLE001 - a run whose output cannot be read keeps its recorded figures
                continue
            score(r, runner, client, measure.read_gt(out / "ground_truth.jsonl"))


def pool_build_time(tok: Path, n: int, tokens: int, pin: bool) -> dict:
    """servesweep's prompt pool for n x tokens, built in a fresh process on the client core with an empty cache
    (cold), then again (warm: its on-disk cache of the pool)."""
    code = (
        "import time,sys; from servesweep.config.point import LoadPoint; from servesweep.workload.build import build_bodies;"
        f"p=LoadPoint(base_url='http://127.0.0.1:9',model='m',probe=False,continuous_usage=False,template_overhead=0,"
        f"concurrency={n},prompt_tokens={tokens},output_tokens=8,requests={n},pool_size={n},tokenizer={str(tok)!r});"
        "t=time.perf_counter(); b,_=build_bodies(p); print(time.perf_counter()-t, len(b))"
    )
    out = {}
    cache = Path(tempfile.mkdtemp(prefix="ss-pool-cache-"))
    env = dict(os.environ, HOME=str(cache))  # prompts cache under ~/.cache/servesweep: empty at first
    for label in ("cold", "warm"):
        cmd = [*(["taskset", "-c", "1"] if pin else []), sys.executable, "-c", code]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cache)
        if r.returncode != 0:
            out[label] = {"error": r.stderr.strip()[-400:]}
        else:
            secs, count = r.stdout.split()
            out[label] = {"seconds": round(float(secs), 2), "prompts": int(count)}
    shutil.rmtree(cache, ignore_errors=True)
    return out


def _git_state() -> str:
    """The commit servesweep ran from, and whether its sources differed from it (other work in progress)."""
    frozen = os.environ.get("SERVESWEEP_BENCH_SRC")
    if frozen:
        return f"{frozen.rsplit('@', 1)[1]} (a copy of the committed sources, --src head)"
    root = HERE.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src/servesweep"], capture_output=True, text=True, cwd=root
        )
    except OSError:
        return "unknown"
    changed = len(dirty.stdout.splitlines())
    return head.stdout.strip() + (f" + {changed} changed files under src/servesweep" if changed else "")


def machine() -> dict:
    import psutil

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _out_name(kind: str, tool: str, concurrency: int) -> str:
    return f"{tool}-long" if kind == "long" else f"{tool}-c{concurrency}"


def _ints(ap, flag: str, text: str, lo: int = 1) -> list[int]:
    try:
        vals = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        ap.error(f"{flag}: {text!r} is not a comma list of integers")
    if any(v < lo for v in vals):
        ap.error(f"{flag}: every value must be >= {lo} (got {text!r})")
    return vals


def _names(ap, flag: str, text: str, known: dict) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in known]
    if bad:
        ap.error(f"{flag}: unknown {', '.join(bad)}; known: {', '.join(known)}")
    return names


def plan_points(tools, streams, ladder, ladder_tools, figures) -> list[tuple[int, str, bool]]:
    """(streams, tool, ladder_only) in run order: ascending stream counts, the tools side by side at each, so
    every comparison at one stream count is measured close in time."""
    want: dict[tuple[int, str], bool] = {}
    if figures & {1, 2}:
        for c in streams:
            for t in tools:
                want[(c, t)] = False
    if 3 in figures:
        for c in sorted(set(streams) | set(ladder)):
            for t in tools:
                if t in ladder_tools:
                    want.setdefault((c, t), True)
    order = {t: i for i, t in enumerate(tools)}
    return [(c, t, lo) for (c, t), lo in sorted(want.items(), key=lambda kv: (kv[0][0], order[kv[0][1]]))]


def chunk_p99(r: dict) -> float | None:
    """The per-chunk p99 error that figure 3 uses: the exact pairing (by id) when the tool has one."""
    for by in ("id", "pattern"):
        a = r.get(f"acc_{by}") or {}
        if a.get("chunk_err_ms", {}).get("p99") is not None and not a.get("last_chunk_only"):
            return a["chunk_err_ms"]["p99"]
    return None


def _merge(old: dict, new: dict) -> dict:
    """A partial rerun: its entries replace the old ones of the same kind, tool and stream count."""
    for kind in ("runs", "long", "workers"):
        mine = {(r["tool"], r["concurrency"]) for r in new.get(kind, [])}
        kept = [r for r in old.get(kind, []) if (r["tool"], r["concurrency"]) not in mine]
        new[kind] = kept + new.get(kind, [])
    for key in ("pool_build",):
        if key not in new and key in old:
            new[key] = old[key]
    new["versions"] = {**old.get("versions", {}), **new.get("versions", {})}
    new["install"] = {**old.get("install", {}), **new.get("install", {})}
    new["history"] = [*old.get("history", []), *new.get("history", [])]
    return new


def main() -> int:
    known = {**RUNNERS, **EXPERIMENTS}
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="servesweep alone, one small point (CI)")
    ap.add_argument(
        "--only",
        "--tools",
        dest="tools",
        default=",".join(RUNNERS),
        help=f"comma list of: {', '.join(known)}",
    )
    ap.add_argument("--figures", default="1,2,3,4,5,6", help="comma list of the figures to measure (1-6)")
    ap.add_argument("--streams", default="64,256,1024", help="concurrency points of figures 1 and 2")
    ap.add_argument("--ladder", default="32,128,512", help="extra concurrency points of figure 3")
    ap.add_argument(
        "--ladder-tools",
        default="servesweep,sglang,vllm,aiperf",
        help="tools that climb the figure-3 ladder (those that stamp every chunk)",
    )
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--long-tokens", type=int, default=100_000, help="long-context prompt length (0: skip)")
    ap.add_argument("--long-concurrency", type=int, default=32)
    ap.add_argument("--long-requests", type=int, default=64)
    ap.add_argument("--pool", type=int, default=64, help="prompts in the pool-build figure (0: skip)")
    ap.add_argument(
        "--workers-streams", default="256,1024", help="stream counts of figure 6 (1 vs 2 workers)"
    )
    ap.add_argument("--workers-duration", type=float, default=10.0, help="seconds per figure-6 point")
    ap.add_argument("--no-install", action="store_true", help="do not create/update the peers' environments")
    ap.add_argument("--timeout", type=float, default=90, help="seconds per tool run")
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="COMMIT",
        help="also run the servesweep-base tool: servesweep from this commit (e.g. the one before a change)",
    )
    ap.add_argument(
        "--src",
        choices=("tree", "head"),
        default="tree",
        help="servesweep from the working tree, or from a copy of the last commit (a checkout others edit)",
    )
    ap.add_argument(
        "--fresh", action="store_true", help="a partial rerun does not merge into the last results"
    )
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument(
        "--render", action="store_true", help="only re-score and re-render peers.md from the files in raw/"
    )
    args = ap.parse_args()
    if args.render:
        results = json.loads((args.out / "raw" / "peers.json").read_text())
        rescore(results, args.out / "raw")
        (args.out / "raw" / "peers.json").write_text(json.dumps(results, indent=1))
        (args.out / "peers.md").write_text(report.render(results))
        print(f"wrote {args.out / 'peers.md'}")
        return 0

    partial = any(a.startswith(("--only", "--tools", "--figures")) for a in sys.argv[1:])
    if args.smoke:
        args.tools, args.streams, args.requests_per_stream, args.figures = "servesweep", "8", 2, "1,2,6"
        args.workers_streams, args.workers_duration = "8", 3.0
        args.output_tokens, args.long_tokens, args.pool, args.no_install = 24, 0, 0, True
    tools = _names(ap, "--only", args.tools, known)
    if args.baseline and "servesweep-base" not in tools:
        tools.append("servesweep-base")  # a baseline is given to be measured (it used to need --only as well)
    ladder_tools = set(_names(ap, "--ladder-tools", args.ladder_tools, known))
    figures = set(_ints(ap, "--figures", args.figures))
    if figures - set(range(1, 7)):
        ap.error(f"--figures: {args.figures!r}: figures are numbered 1 to 6")
    streams = _ints(ap, "--streams", args.streams)
    ladder = _ints(ap, "--ladder", args.ladder) if args.ladder else []
    workers_streams = _ints(ap, "--workers-streams", args.workers_streams)
    if args.workers_duration <= 0:
        ap.error("--workers-duration: must be > 0 seconds")
    for r in WORKER_RUNNERS.values():
        r.duration_s = args.workers_duration

    if args.baseline:
        base = EXPERIMENTS["servesweep-base"]
        try:
            full = subprocess.run(
                ["git", "rev-parse", "--verify", f"{args.baseline}^{{commit}}"],
                capture_output=True,
                text=True,
                cwd=HERE.parent,
                check=True,
            ).stdout.strip()
        except subprocess.CalledProcessError:
            ap.error(f"--baseline: {args.baseline!r} is not a commit of this repository")
        dest = Path(tempfile.mkdtemp(prefix="ss-bench-base-"))
        archive = subprocess.run(
            ["git", "archive", full, "src"], capture_output=True, cwd=HERE.parent, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        base.src, base.commit = dest / "src", full[:12]

    started = time.time()
    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    peers = [t for t in tools if t in RUNNERS and t != "servesweep"]
    install_log = {}
    if peers and not args.no_install:
        import install

        install_log = install.ensure(peers)
    tok = tokenizer_dir.build(VENVS / "tokenizer" if not args.smoke else args.out / "raw" / "tokenizer")
    pin = measure.pin_available()
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    results = {
        "command": command,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": machine(),
        "pinned": pin,
        "servesweep_git": _git_state(),
        "versions": {t: known[t].version() for t in tools},
        "install": install_log,
        "emulator": {"model": MODEL, "decode_calibration": DECODE_CAL, "long_calibration": LONG_CAL},
        "shape": {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens},
        "ladder": {"points": sorted(set(streams) | set(ladder)), "tools": sorted(ladder_tools)},
        "runs": [],
        "long": [],
        "workers": [],
    }
    results["history"] = [
        {
            "command": command,
            "date_utc": results["date_utc"],
            "load_avg": results["machine"]["load_avg_at_start"],
        }
    ]
    name = "smoke.json" if args.smoke else "peers.json"
    if partial and not args.fresh and not args.smoke and (raw / name).is_file():
        base = json.loads((raw / name).read_text())
        keep = lambda: _merge(json.loads(json.dumps(base)), json.loads(json.dumps(results)))  # noqa: E731
    else:
        keep = lambda: results  # noqa: E731

    def save():
        (raw / name).write_text(json.dumps(keep(), indent=1))

    def job_for(t: str, c: int, requests: int, prompt: int, output: int, kind: str = "runs") -> Job:
        return Job(
            base_url="",
            model="m",
            tokenizer=tok,
            concurrency=c,
            requests=requests,
            prompt_tokens=prompt,
            output_tokens=output,
            out=raw / _out_name(kind, t, c),
        )

    above: dict[str, list[bool]] = {}  # per tool: did each point so far exceed 1 ms p99?
    for c, t, ladder_only in plan_points(tools, streams, ladder, ladder_tools, figures):
        if ladder_only and above.get(t, [])[-2:] == [True, True]:
            print(json.dumps({"tool": t, "concurrency": c, "skipped": "p99 > 1 ms at its last two points"}))
            continue
        job = job_for(t, c, c * args.requests_per_stream, args.prompt_tokens, args.output_tokens)
        r = run_one(known[t], job, tok, DECODE_CAL, pin, args.timeout)
        r["ladder_only"] = ladder_only
        p99 = chunk_p99(r)
        above.setdefault(t, []).append(p99 is None or p99 > 1.0)
        print(
            json.dumps(
                {k: r.get(k) for k in ("tool", "concurrency", "cpu_us_per_chunk", "error")} | {"p99": p99}
            )
        )
        results["runs"].append(r)
        save()
    if 4 in figures and args.long_tokens:
        for t in tools:
            job = job_for(t, args.long_concurrency, args.long_requests, args.long_tokens, 8, kind="long")
            extra = ["--context-length", str(args.long_tokens + 4096)]
            # servesweep caches its prompt pools on disk (~/.cache/servesweep); the peers generate their data at
            # every launch. Cold here, as the peers are: an empty HOME (its warm figure is figure 5's pool build).
            cold = {"HOME": tempfile.mkdtemp(prefix="ss-long-home-")} if t.startswith("servesweep") else None
            r = run_one(
                known[t],
                job,
                tok,
                LONG_CAL,
                pin,
                args.timeout,
                extra,
                prompt_tokens=args.long_tokens,
                env_extra=cold,
            )
            r["prompt_cache"] = "cold cache" if cold else None
            if cold:
                shutil.rmtree(cold["HOME"], ignore_errors=True)
            print(json.dumps({k: r.get(k) for k in ("tool", "acc_pattern", "error")}))
            results["long"].append(r)
            save()
    if 6 in figures and "servesweep" in tools:
        for c in workers_streams:
            for w in WORKER_RUNNERS.values():
                job = job_for(w.name, c, 0, args.prompt_tokens, args.output_tokens)
                r = run_one(w, job, tok, DECODE_CAL, pin, args.timeout)
                r["workers"] = w.workers
                print(json.dumps({k: r.get(k) for k in ("tool", "concurrency", "cpu_us_per_chunk", "error")}))
                results["workers"].append(r)
                save()
    if 5 in figures and args.pool and "servesweep" in tools:
        results["pool_build"] = pool_build_time(tok, args.pool, args.long_tokens or 100_000, pin)
    results["wall_s"] = round(time.time() - started, 1)
    results["history"][-1]["wall_s"] = results["wall_s"]
    save()
    md = report.render(keep())
    out_md = "peers-smoke.md" if args.smoke else "peers.md"
    (args.out / out_md).write_text(md)
    print(f"wrote {args.out / out_md} in {results['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

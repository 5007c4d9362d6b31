"""Soak benchmark (issue 18): field-scale load at REAL timing on the emulator, for tens of minutes.

Two parts, by default at the same time, each against its own emulator process (each emulates its own 2x RTX A6000):

1. **Matrix**: a cut of the seed-B matrix (examples/qwen36-27b-a6000-tp2.yaml: Qwen3.6-27B, TP2, NEXTN 3 steps,
   SGLang 0.5.11, context_length 131072 as `servesweep plan` advises for the long-context points), one
   `servesweep load --duration` point after another, closed loop, 500 output tokens, no time compression:
   1000-token prompts at concurrency 32 (queued waves behind the 11 running slots), 30k at 4, 60k at 4, 100k at 2.
   `--minutes` is split evenly over the points.
2. **Web UI**: `locust -f locustfiles/llm.py --host ...` with its web UI, started through the web API (POST /swarm
   with the start form's fields: load_shape=step-ramp, ramp_steps, ramp_hold, prompt/output tokens), a step ramp
   of `--webui-minutes` in all; Locust's -s lets the last streams finish; SIGTERM at the end writes the records.

Every ~10 s the VmRSS and the open file descriptors of every Locust process under the processes this script
started are sampled (/proc/<pid>/status, /proc/<pid>/fd). At the end, every record is checked against the
emulator's ground truth (--sim-ground-truth, paired by X-Request-Id):
- false failures: a failed record whose ground truth shows no cause (no injected fault, HTTP 200, and the emulator
  never left a gap as long as the timeout the client reported: first write - receive < first_token_s, every gap
  between writes and the last write to the end < stall_s); timeout_* classes are counted apart;
- every request the emulator completed (200, all tokens written, not aborted) is a success in the records;
- the emulator's request count (ground-truth lines with a client id, and its /metrics) equals the client's records
  (the lines without a client id are servesweep load's probes, counted apart);
- RSS and fds of each Locust process are flat: after warm-up (--warm-s, at least 10 % of its life) RSS grows
  < max(16 MiB, 10 %), and fds minus running users in the second half never exceed the first half's by more than 4
  (a process that lived < 2 x --warm-s is reported, not judged: "short").

    .venv/bin/python bench/bench_soak.py --minutes 32 --webui-minutes 11          # the full soak (~40 min)
    .venv/bin/python bench/bench_soak.py --minutes 3 --points 1000x4 --webui-minutes 3 --ramp-steps 1,2 \
        --webui-prompt-tokens 1000                                                  # a 3-4 minute smoke

Prints a table; writes OUT/soak.json (default OUT: /tmp/servesweep-soak-<stamp>, outside the repository).
Exit 0 when every check passed, 1 otherwise. Everything is bounded: each part has a hard deadline, after which the
process groups this script started are ended (by their pid, never by name).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# The children (servesweep load, locust, the emulator) import the same servesweep as this script: the tree this file
# sits in (run a copy of it inside a `git archive` of a commit to measure that commit, whatever the checkout holds).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)

from servesweep.sim.launch import free_port, start_sim  # noqa: E402

# examples/qwen36-27b-a6000-tp2.yaml's server, as the role renders it for the emulator (context 131072: plan's fix)
SIM_ARGS = [
    "--model-path", "Qwen/Qwen3.6-27B", "--tp", "2", "--sim-gpu", "A6000", "--sim-sglang-version", "0.5.11",
    "--context-length", "131072", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    "--mamba-scheduler-strategy", "extra_buffer", "--enable-metrics", "--enable-cache-report",
]  # fmt: skip
SIM_ENV = {"SGLANG_ENABLE_SPEC_V2": "1"}
DEFAULT_POINTS = "1000x32,30000x4,60000x4,100000x2"  # prompt_tokens x concurrency
FIRST_TOKEN_S, STALL_S, TOTAL_S = 900.0, 120.0, 3600.0  # the client's defaults (servesweep load, locustfile)
MIB = 1024.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- sampling


class Sampler:
    """Every `every_s`, VmRSS and open fds of each Locust process under the registered roots (pids we started)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.roots: dict[int, str] = {}  # root pid -> label
        self.users: dict[str, int] = {}  # label -> current running users (when known)
        self.series: dict[int, dict] = {}  # pid -> {label, cmd, samples: [[t, rss_kib, fds, users]]}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self.t0 = time.monotonic()

    def start(self) -> None:
        self._t.start()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(30)

    def add_root(self, pid: int, label: str) -> None:
        with self._lock:
            self.roots[pid] = label

    def remove_root(self, pid: int) -> None:
        with self._lock:
            self.roots.pop(pid, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    @staticmethod
    def _locust_procs(root: int) -> list[psutil.Process]:
        try:
            r = psutil.Process(root)
            procs = [r, *r.children(recursive=True)]
        except psutil.Error:
            return []
        out = []
        for p in procs:
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if any(
                a == "locust" or a.endswith("/locust") for a in cmd
            ):  # python -m locust / the locust script
                out.append(p)
        return out

    def sample(self) -> None:
        with self._lock:
            roots = dict(self.roots)
        now = round(time.monotonic() - self.t0, 2)
        for root, label in roots.items():
            for p in self._locust_procs(root):
                try:
                    status = Path(f"/proc/{p.pid}/status").read_text()
                    fds = len(os.listdir(f"/proc/{p.pid}/fd"))
                    cmd = " ".join(p.cmdline())
                except (OSError, psutil.Error):
                    continue
                m = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.M)
                if not m:
                    continue
                s = self.series.setdefault(p.pid, {"label": label, "cmd": cmd[:300], "samples": []})
                s["samples"].append([now, int(m.group(1)), fds, self.users.get(label)])


def flatness(samples: list[list], const_users: int | None, warm_s: float = 60.0) -> dict:
    """RSS/fd figures of one process; `flat_*` per the module doc, judged over the samples taken while users ran
    (a sample's users: what it recorded, else const_users). start/end/max are over every sample (before the web
    UI's start and after its stop too)."""
    if not samples:
        return {"samples": 0}

    def users(s):
        return s[3] if s[3] is not None else (const_users or 0)

    run = [s for s in samples if users(s) > 0] or samples
    t0, t1 = run[0][0], run[-1][0]
    short = t1 - t0 < 2 * warm_s  # too short a life to call flat or not
    warm_t = t0 + (0.10 * (t1 - t0) if short else max(0.10 * (t1 - t0), warm_s))  # start-up is not growth
    warm = next(s for s in run if s[0] >= warm_t)
    after = [s for s in run if s[0] >= warm_t]
    mid = t0 + 0.5 * (t1 - t0)
    first = [s[2] - users(s) for s in after if s[0] < mid] or [warm[2] - users(warm)]
    second = [s[2] - users(s) for s in after if s[0] >= mid] or [run[-1][2] - users(run[-1])]
    rss_growth = max(s[1] for s in after) - warm[1]
    rss = [s[1] for s in samples]
    fds = [s[2] for s in samples]
    return {
        "samples": len(samples),
        "samples_running": len(run),
        "life_s": round(samples[-1][0] - samples[0][0], 1),
        "running_s": round(t1 - t0, 1),
        "rss_start_mib": round(rss[0] / MIB, 1),
        "rss_warm_mib": round(warm[1] / MIB, 1),
        "rss_end_running_mib": round(run[-1][1] / MIB, 1),
        "rss_end_mib": round(rss[-1] / MIB, 1),
        "rss_max_mib": round(max(rss) / MIB, 1),
        "rss_growth_after_warm_mib": round(rss_growth / MIB, 1),
        "fds_start": fds[0],
        "fds_warm": warm[2],
        "fds_end_running": run[-1][2],
        "fds_end": fds[-1],
        "fds_max": max(fds),
        "fds_minus_users_first_half_max": max(first),
        "fds_minus_users_second_half_max": max(second),
        "flat_rss": None if short else rss_growth <= max(16 * MIB, 0.10 * warm[1]),
        "flat_fds": None if short else max(second) <= max(first) + 4,
    }


# ---------------------------------------------------------------- checks against the ground truth


def read_records(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    cols = [
        "request_id",
        "point_id",
        "worker",
        "error_class",
        "error_message",
        "completion_tokens",
        "http_status",
    ]
    t = pq.read_table(path, columns=cols)
    return t.to_pylist()


def justified(rec: dict, g: dict | None, fto: float, stall: float, total: float) -> bool:
    """Whether the emulator's ground truth explains this failed record (else it is a false failure)."""
    if g is None:
        return rec.get("error_class") in ("timeout_connect", "connection_reset")  # never reached the server
    if g.get("fault") or g.get("status") != 200:
        return True
    writes = [c[0] for c in (g.get("chunks") or [])]
    end = g.get("end_ns") or 0
    recv = g.get("recv_ns") or 0
    first = writes[0] if writes else end
    gaps = [b - a for a, b in zip(writes, writes[1:], strict=False)] + ([end - writes[-1]] if writes else [])
    if (first - recv) / 1e9 >= fto or (end - recv) / 1e9 >= total:
        return True
    return bool(gaps) and max(gaps) / 1e9 >= stall


def completed(g: dict, output_tokens: int) -> bool:
    return (
        g.get("status") == 200
        and g.get("finish_reason") not in (None, "abort")
        and g.get("completion_tokens") == output_tokens
        and not g.get("fault")
    )


def scrape_counts(base_url: str) -> dict:
    """The emulator's own counters from /metrics (sums over label sets)."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": str(e)}
    out: dict[str, float] = {}
    for name in ("num_requests_total", "num_aborted_requests_total"):
        vals = re.findall(rf"^sglang:{name}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", text, re.M)
        out[name] = sum(float(v) for v in vals) if vals else None
    return out


def check_part(name: str, records: list[dict], gt: list[dict], output_tokens: int) -> dict:
    by_id = {g["id"]: g for g in gt}
    rec_ids = {r["request_id"] for r in records}
    failed = [r for r in records if r.get("error_class") is not None]
    classes: dict[str, int] = {}
    for r in failed:
        classes[r["error_class"]] = classes.get(r["error_class"], 0) + 1
    false = [
        r for r in failed if not justified(r, by_id.get(r["request_id"]), FIRST_TOKEN_S, STALL_S, TOTAL_S)
    ]
    ok_ids = {r["request_id"] for r in records if r.get("error_class") is None}
    gt_client = [g for g in gt if g["id"] in rec_ids]
    gt_other = [g for g in gt if g["id"] not in rec_ids]
    done_not_ok = [g["id"] for g in gt_client if completed(g, output_tokens) and g["id"] not in ok_ids]
    missing = sorted(rec_ids - set(by_id))
    examples = [
        {k: r.get(k) for k in ("request_id", "point_id", "error_class", "error_message", "completion_tokens")}
        for r in false[:5]
    ]
    return {
        "part": name,
        "client_records": len(records),
        "ok": len(records) - len(failed),
        "failed": len(failed),
        "failures_by_class": classes,
        "timeouts": sum(v for k, v in classes.items() if k.startswith("timeout_")),
        "false_failures": len(false),
        "false_failure_examples": examples,
        "emulator_requests_with_client_id": len(gt_client),
        "emulator_lines_without_client_id": len(gt_other),  # servesweep load's probes
        "emulator_completed": sum(1 for g in gt_client if completed(g, output_tokens)),
        "emulator_completed_not_ok_in_records": len(done_not_ok),
        "records_missing_from_emulator": len(missing),
        "ok_tokens_exact": all(
            r.get("completion_tokens") == output_tokens for r in records if r.get("error_class") is None
        ),
    }


# ---------------------------------------------------------------- processes we start


def end_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM then SIGKILL the process group of a process we started in its own session (by its pid)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_matrix(args, out: Path, sampler: Sampler, deadline: float, result: dict) -> None:
    points = []
    for item in args.points.split(","):
        p, c = item.lower().split("x")
        points.append((int(float(p)), int(c)))
    per_point_s = max(5.0, args.minutes * 60.0 / len(points))
    (out / "matrix").mkdir(parents=True, exist_ok=True)
    gt_path = out / "matrix" / "ground_truth.jsonl"
    result.update(points=[], per_point_s=per_point_s)
    t_start = time.monotonic()
    with start_sim(SIM_ARGS, ground_truth=gt_path, env=SIM_ENV, log_path=out / "matrix" / "sim.log") as sim:
        result["emulator_pid"] = sim.pid
        for p_tokens, conc in points:
            pdir = out / "matrix" / f"p{p_tokens}-c{conc}"
            pdir.mkdir(parents=True, exist_ok=True)
            cmd = [
                str(Path(sys.executable).with_name("servesweep")), "load", "--base-url", sim.base_url,
                "--concurrency", str(conc), "--prompt-tokens", str(p_tokens),
                "--output-tokens", str(args.output_tokens), "--duration", f"{per_point_s:.1f}s",
                "--out", str(pdir / "runs"), "--json",
            ]  # fmt: skip
            log(f"matrix point p{p_tokens} c{conc}: {per_point_s:.0f} s")
            t0 = time.monotonic()
            # a hard bound per point: its duration, the longest queued first token and stream, then margin
            limit = min(per_point_s + args.point_slack_s, deadline - time.monotonic())
            with open(pdir / "load.out", "wb") as f:
                proc = subprocess.Popen(
                    cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                )
            sampler.add_root(proc.pid, f"matrix p{p_tokens} c{conc}")
            sampler.users[f"matrix p{p_tokens} c{conc}"] = conc
            try:
                rc = proc.wait(max(1.0, limit))
            except subprocess.TimeoutExpired:
                log(f"matrix point p{p_tokens} c{conc}: past its bound of {limit:.0f} s, ending it")
                end_group(proc)
                rc = "killed"
            sampler.sample()
            sampler.remove_root(proc.pid)
            recs = sorted(pdir.glob("runs/**/records.parquet"))
            records = [r for path in recs for r in read_records(path)]
            result["points"].append(
                {
                    "point": f"p{p_tokens}-c{conc}",
                    "prompt_tokens": p_tokens,
                    "concurrency": conc,
                    "exit_code": rc,
                    "wall_s": round(time.monotonic() - t0, 1),
                    "root_pid": proc.pid,
                    "records": len(records),
                }
            )
            result.setdefault("_records", []).extend(records)
            log(f"matrix point p{p_tokens} c{conc}: rc {rc}, {len(records)} records")
        time.sleep(2.0)  # the emulator flushes its ground truth at least once a second
        result["emulator_metrics"] = scrape_counts(sim.base_url)
    result["gt"] = gt_path
    result["wall_s"] = round(time.monotonic() - t_start, 1)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def run_webui(args, out: Path, sampler: Sampler, deadline: float, result: dict) -> None:
    steps = [int(s) for s in args.ramp_steps.split(",")]
    hold = max(2.0, args.webui_minutes * 60.0 / len(steps))
    wdir = out / "webui"
    wdir.mkdir(parents=True, exist_ok=True)
    gt_path = wdir / "ground_truth.jsonl"
    label = "webui step-ramp"
    result.update(ramp_steps=steps, ramp_hold_s=hold, prompt_tokens=args.webui_prompt_tokens)
    t_start = time.monotonic()
    with start_sim(SIM_ARGS, ground_truth=gt_path, env=SIM_ENV, log_path=wdir / "sim.log") as sim:
        result["emulator_pid"] = sim.pid
        port = free_port()
        ui = f"http://127.0.0.1:{port}"
        llm = ["--prompt-tokens", str(args.webui_prompt_tokens), "--output-tokens", str(args.output_tokens)]
        cmd = [
            sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "llm.py"), "--host", sim.base_url,
            "--web-host", "127.0.0.1", "--web-port", str(port), "-s", str(int(args.webui_stop_timeout_s)), *llm,
            "--records", str(wdir / "records.parquet"), "--steps-csv", str(wdir / "steps.csv"),
        ]  # fmt: skip
        result["command"] = " ".join(cmd)
        with open(wdir / "locust.log", "wb") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        sampler.add_root(proc.pid, label)
        sampler.users[label] = 0
        result["root_pid"] = proc.pid
        try:
            t_ui = time.monotonic()
            while True:  # the UI answers once the locustfile has built its prompt pool
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"locust exited {proc.returncode}: {(wdir / 'locust.log').read_text()[-2000:]}"
                    )
                try:
                    _get_json(ui + "/stats/requests")
                    break
                except OSError:
                    if time.monotonic() - t_ui > 300:
                        raise RuntimeError("the web UI did not come up within 300 s") from None
                    time.sleep(1.0)
            form = {
                "user_count": str(steps[0]),
                "spawn_rate": "1",
                "host": sim.base_url,
                "load_shape": "step-ramp",
                "ramp_steps": args.ramp_steps,
                "ramp_hold": f"{hold:g}",
                "ramp_spawn_rate": "0",
                "prompt_tokens": str(args.webui_prompt_tokens),
                "output_tokens": str(args.output_tokens),
            }
            req = urllib.request.Request(ui + "/swarm", data=urllib.parse.urlencode(form).encode())
            with urllib.request.urlopen(req, timeout=30) as r:
                swarm = json.load(r)
            result["swarm_response"] = swarm
            if not swarm.get("success"):
                raise RuntimeError(f"/swarm refused: {swarm}")
            log(f"web UI: step ramp {steps}, {hold:.0f} s per step, started through POST /swarm")
            t_swarm = time.monotonic()
            seen_running = False
            last_state = None
            while True:
                if time.monotonic() > deadline:
                    raise RuntimeError("web UI ramp past the deadline")
                d = _get_json(ui + "/stats/requests")
                state = d.get("state")
                sampler.users[label] = int(d.get("user_count") or 0)
                if state != last_state:
                    log(f"web UI: state {state}, users {d.get('user_count')}")
                    last_state = state
                seen_running |= state in ("spawning", "running")
                if seen_running and state == "stopped":
                    break
                time.sleep(2.0)
            result["ramp_s"] = round(time.monotonic() - t_swarm, 1)
            try:
                live = _get_json(ui + "/servesweep/live.json")
                result["steps"] = [
                    {k: s.get(k) for k in ("index", "concurrency", "duration_s")}
                    for s in live.get("steps", [])
                ]
            except OSError as e:
                result["steps_error"] = str(e)
            sampler.sample()
        finally:
            # Locust quits on SIGTERM (writing the records at quit); the process is ours, ended by its pid
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    end_group(proc, grace=5)
            end_group(proc, grace=5)  # anything left in its group
            sampler.remove_root(proc.pid)
        result["exit_code"] = proc.returncode
        time.sleep(2.0)
        result["emulator_metrics"] = scrape_counts(sim.base_url)
    rp = wdir / "records.parquet"
    result["_records"] = read_records(rp) if rp.exists() else []
    result["gt"] = gt_path
    result["wall_s"] = round(time.monotonic() - t_start, 1)


# ---------------------------------------------------------------- main


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0], "code": str(ROOT)}
    for pkg in ("servesweep", "locust", "gevent", "geventhttpclient"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    try:
        out["commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        out["rxstamp_commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h", "--", "src/servesweep/client/rxstamp.py"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except OSError:
        pass
    stamp = ROOT / ".soak-commit"  # written beside a `git archive` snapshot, which has no .git
    if not out.get("commit") and stamp.is_file():
        out["commit"] = stamp.read_text().strip()
    return out


def table(rows: list[dict]) -> str:
    cols = [
        ("process", "label"), ("life s", "life_s"), ("requests", "requests"), ("ok", "ok"),
        ("failed", "failed"), ("timeouts", "timeouts"), ("false fail", "false_failures"),
        ("RSS start/end/max MiB", "rss"), ("RSS growth MiB", "rss_growth_after_warm_mib"),
        ("fds start/end/max", "fds"), ("flat", "flat"),
    ]  # fmt: skip
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for _, k in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--minutes", type=float, default=32.0, help="matrix: minutes of load, split over the points"
    )
    ap.add_argument(
        "--webui-minutes", type=float, default=11.0, help="web UI step ramp: minutes in all (0: none)"
    )
    ap.add_argument("--points", default=DEFAULT_POINTS, help="matrix points: PROMPTxCONCURRENCY,...")
    ap.add_argument("--output-tokens", type=int, default=500)
    ap.add_argument("--ramp-steps", default="1,2,4,8", help="web UI ramp user counts")
    ap.add_argument("--webui-prompt-tokens", type=int, default=30000)
    ap.add_argument("--webui-stop-timeout-s", type=float, default=900.0, help="Locust -s for the ramp's end")
    ap.add_argument("--sample-s", type=float, default=10.0, help="RSS/fd sampling interval")
    ap.add_argument(
        "--warm-s", type=float, default=60.0, help="RSS/fds: growth counts from here (and 10 %% of the life)"
    )
    ap.add_argument(
        "--point-slack-s", type=float, default=1200.0, help="hard bound per point past its duration"
    )
    ap.add_argument(
        "--sequential", action="store_true", help="the web UI ramp after the matrix, not beside it"
    )
    ap.add_argument("--out", type=Path, default=None, help="default /tmp/servesweep-soak-<stamp>")
    ap.add_argument("--recheck", type=Path, default=None, help="a finished run's soak.json: check it again")
    args = ap.parse_args(argv)
    if args.recheck is not None:
        return recheck(args.recheck, None)
    out = args.out or Path(f"/tmp/servesweep-soak-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    budget_s = (args.minutes + args.webui_minutes) * 60 + args.point_slack_s + 1800
    deadline = time.monotonic() + budget_s
    log(f"soak: matrix {args.minutes} min ({args.points}), web UI {args.webui_minutes} min; out {out}")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    sampler = Sampler(args.sample_s)
    sampler.start()
    parts: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def guarded(name, fn):
        parts[name] = {}
        try:
            fn(args, out, sampler, deadline, parts[name])
        except Exception as e:  # noqa: BLE001 - reported, and the run fails
            errors[name] = f"{type(e).__name__}: {e}"
            log(f"{name}: {errors[name]}")

    jobs = []
    if args.minutes > 0:
        jobs.append(("matrix", run_matrix))
    if args.webui_minutes > 0:
        jobs.append(("webui", run_webui))
    t0 = time.monotonic()
    if args.sequential:
        for name, fn in jobs:
            guarded(name, fn)
    else:
        threads = [threading.Thread(target=guarded, args=j, daemon=True) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, deadline - time.monotonic() + 120))
    sampler.stop()
    wall = time.monotonic() - t0

    doc = analyze(args, out, parts, sampler.series, errors, [n for n, _ in jobs])
    doc.update(started=started, argv=sys.argv, versions=versions(), wall_s=round(wall, 1))
    return report(out, doc)


def point_records(out: Path, pt: str | None = None) -> list[dict]:
    paths = sorted((out / "matrix").glob(f"{pt or '*'}/runs/**/records.parquet"))
    return [r for path in paths for r in read_records(path)]


def analyze(args, out: Path, parts: dict, series: dict, errors: dict, jobs: list[str]) -> dict:
    """Every check, from what the run left on disk (records, ground truth) and the RSS/fd samples."""
    from servesweep.sim.groundtruth import read_ground_truth

    checks: dict[str, dict] = {}
    gts: dict[str, list[dict]] = {}
    all_ok = not errors
    for name, part in parts.items():
        part.pop("_records", None)
        if "gt" not in part:
            all_ok = False
            continue
        gts[name] = read_ground_truth(part["gt"])
        if name == "matrix":
            recs = point_records(out)
        else:
            rp = out / "webui" / "records.parquet"
            recs = read_records(rp) if rp.exists() else []
        c = check_part(name, recs, gts[name], args.output_tokens)
        m = part.get("emulator_metrics", {})
        c["emulator_metrics_num_requests"] = m.get("num_requests_total")
        c["emulator_metrics_num_aborted"] = m.get("num_aborted_requests_total")
        checks[name] = c
        part["gt"] = str(part["gt"])
    # one row per Locust process: its RSS/fds, and the request figures of what it ran (a matrix point, the ramp)
    rows, procs = [], []
    for pid, s in series.items():
        label = s["label"]
        matrix = label.startswith("matrix")
        f = flatness(s["samples"], int(label.rsplit("c", 1)[1]) if matrix else None, args.warm_s)
        row = {"pid": int(pid), "label": label, **f}
        c = None
        if matrix and "matrix" in gts:
            pt = label.split(" ", 1)[1].replace(" ", "-")
            c = check_part(pt, point_records(out, pt), gts["matrix"], args.output_tokens)
            for p in parts["matrix"].get("points", []):
                if p["point"] == pt:
                    p["check"] = c
        elif not matrix:
            c = checks.get("webui")
        if c is not None:
            row.update(
                requests=c["client_records"],
                ok=c["ok"],
                failed=c["failed"],
                timeouts=c["timeouts"],
                false_failures=c["false_failures"],
            )
        row["rss"] = f"{row.get('rss_start_mib')}/{row.get('rss_end_mib')}/{row.get('rss_max_mib')}"
        row["fds"] = f"{row.get('fds_start')}/{row.get('fds_end')}/{row.get('fds_max')}"
        if row.get("flat_rss") is None:
            row["flat"] = "short"  # ran < 2 x --warm-s: reported, not judged
        else:
            row["flat"] = "yes" if row["flat_rss"] and row["flat_fds"] else "NO"
        rows.append(row)
        procs.append({**row, "cmd": s["cmd"], "samples_raw": s["samples"]})
    verdict = {
        "false_failures": sum(c["false_failures"] for c in checks.values()),
        "failed": sum(c["failed"] for c in checks.values()),
        "timeouts": sum(c["timeouts"] for c in checks.values()),
        "completed_not_ok": sum(c["emulator_completed_not_ok_in_records"] for c in checks.values()),
        "counts_equal": all(
            c["client_records"] == c["emulator_requests_with_client_id"]
            and c["records_missing_from_emulator"] == 0
            for c in checks.values()
        ),
        "ok_tokens_exact": all(c["ok_tokens_exact"] for c in checks.values()),
        "flat": bool(rows) and all(r["flat"] in ("yes", "short") for r in rows),
        "every_part_ran": not errors and set(parts) == set(jobs),
        "sampled_every_locust_process": bool(rows) and all(r.get("samples", 0) >= 1 for r in rows),
    }
    passed = (
        all_ok
        and verdict["false_failures"] == 0
        and verdict["failed"] == 0
        and verdict["completed_not_ok"] == 0
        and verdict["counts_equal"]
        and verdict["ok_tokens_exact"]
        and verdict["flat"]
        and verdict["every_part_ran"]
    )
    verdict["passed"] = passed
    return {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "jobs": jobs,
        "parts": parts,
        "checks": checks,
        "processes": procs,
        "rows": rows,
        "errors": errors,
        "verdict": verdict,
    }


def report(out: Path, doc: dict) -> int:
    (out / "soak.json").write_text(json.dumps(doc, indent=1, default=str))
    print()
    print(table(doc["rows"]))
    print()
    for name, c in doc["checks"].items():
        print(
            f"{name}: {c['client_records']} client records, {c['ok']} ok, {c['failed']} failed "
            f"{c['failures_by_class']}, {c['false_failures']} false failures; emulator: "
            f"{c['emulator_requests_with_client_id']} requests with a client id "
            f"(+{c['emulator_lines_without_client_id']} probes), {c['emulator_completed']} completed, "
            f"{c['emulator_completed_not_ok_in_records']} completed but not ok in the records; /metrics "
            f"num_requests_total {c['emulator_metrics_num_requests']}, aborted {c['emulator_metrics_num_aborted']}"
        )
    for name, e in doc["errors"].items():
        print(f"{name}: ERROR {e}")
    print(f"verdict: {json.dumps(doc['verdict'])}")
    print(f"wall {doc.get('wall_s', 0) / 60:.1f} min; JSON: {out / 'soak.json'}")
    return 0 if doc["verdict"]["passed"] else 1


def recheck(path: Path, warm_s: float | None) -> int:
    """Run the checks again on a finished run's folder (its soak.json, records and ground truth), e.g. after a
    change to a check's rule; the previous soak.json is kept as soak.prev.json."""
    old = json.loads(path.read_text())
    args = argparse.Namespace(**old["args"])
    if warm_s is not None:
        args.warm_s = warm_s
    out = path.parent
    series = {
        p["pid"]: {"label": p["label"], "cmd": p["cmd"], "samples": p["samples_raw"]}
        for p in old["processes"]
    }
    jobs = old.get("jobs") or [n for n in ("matrix", "webui") if n in old["parts"]]
    doc = analyze(args, out, old["parts"], series, old["errors"], jobs)
    for k in ("started", "argv", "versions", "wall_s"):
        doc[k] = old.get(k)
    doc["rechecked"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    path.with_name("soak.prev.json").write_text(path.read_text())
    return report(out, doc)


if __name__ == "__main__":
    sys.exit(main())

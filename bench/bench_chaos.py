"""Chaos soak (issue 35; not CI): emulated matrices with faults injected at random, then every point judged.

    nice -n 10 .venv/bin/python bench/bench_chaos.py --minutes 30 [--seed 35] [--out DIR]

Rounds of `servesweep run` (a real matrix through Ansible: 2 server configurations x 2 concurrencies, 12 requests per
point, 2 local Locust workers) against the emulator behind a generic launcher that writes each server's ground truth
(`--sim-ground-truth`; real time, ~15 ms a token). Each round draws its per-request fault rates (none, or 1-2 % each of 429, 500, disconnect,
error_event, malformed, stall:5) and, for every attempt of a point that starts, one of: nothing, a SIGKILL of the
server's process group (by its pidfile), a hang (`POST /sim/fault {"hang": true}`), a crawl (`{"crawl": 3}`), a
SIGKILL of one of the point's two Locust workers (by the pid its status file names), 0.3-1.5 s into the attempt.
Everything is drawn from one seeded generator and logged (`chaos.jsonl` in the out folder, one line per injection).
Only processes the round started are killed: the run's own session and the servers named by its pidfiles.

After each round every point of its manifest is judged:
- `done`: its records are checked against the emulator's ground truth: every successful record's completion
  tokens and per-chunk token counts exactly; every failed record's class is the one its injected per-request
  fault gives, or the point had a server or worker fault; measured requests = asked, unless the point is degraded.
  A done point that fails any of it is **silently wrong**;
- `degraded` (done, marked): a worker was lost; its records must still match the ground truth;
- `failed` / `server_failed`: marked, with a reason;
- anything else (a point left pending or running): unfinished, counted as a failure of the soak;
and every server SIGKILL and hang that landed must be in the manifest as a crash of its point that says `the
server died` or `the server hung` (the configuration's `crashes[].what`).
A round that does not end within its bound (every wait in servesweep is bounded) is killed and counted as hung.

Prints one JSON line of figures and exits 1 when a point was silently wrong, unfinished, or a round hung. Run it
with the orchestrator patch of issue 35 applied (a hang is then known within 33 s, not 186 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3.6-27B"
REQUESTS = 12
STALL_S = 3.0
EXPECTED = {  # injected per-request fault -> the record's class (tests/matrix/test_reliability_faults.py)
    "429": "http_429",
    "500": "http_5xx",
    "disconnect": "connection_reset",
    "error_event": "stream_error_event",
    "malformed": "malformed_chunk",
    "stall": "timeout_stall",  # 5 s > stall_s 3 s
}
FAULTS = (("none", 0.3), ("server_kill", 0.15), ("hang", 0.15), ("crawl", 0.15), ("worker_kill", 0.25))
ROUND_BOUND_S = 420

WRAPPER = """#!/bin/sh
py="$1"; model="$2"; host="$3"; port="$4"; shift 4
exec "$py" -m servesweep.sim --model-path "$model" --host "$host" --port "$port" --sim-load-time 0.1 \\
  --sim-seed $$ --sim-ground-truth {gt}/$port-$$.jsonl {rates} "$@"
"""


def experiment(d: Path, name: str, rates: str) -> Path:
    (d / "gt").mkdir(parents=True)
    wrapper = d / "server.sh"
    wrapper.write_text(WRAPPER.format(gt=d / "gt", rates=f"--sim-fault-rate {rates}" if rates else ""))
    exp = {
        "name": name,
        "target": {"inventory": "local", "port": 0},
        "model": {"path": MODEL, "served_model_name": MODEL},
        "answers": {"needle_probes": False},
        "launcher": {
            "python": sys.executable,
            "command": ["/bin/sh", str(wrapper), "{python}", "{model_path}", "{host}", "{port}"],
            "verify": False,
            "flush_cache_path": None,
            "workdir": str(d / "srv"),
            "startup_timeout_s": 30,
            "stop_timeout_s": 5,
        },
        "server": {"base": {"context_length": 4096}, "axes": {"max_running_requests": [8, 16]}},
        "load": {
            "concurrency": [2, 4],
            "prompt_tokens": [64],
            "output_tokens": [64],
            "requests": REQUESTS,
            "workers": 2,
            "first_token_s": 3,
            "stall_s": STALL_S,
            "total_s": 30,
            "max_failure_rate": 0.5,
        },
        "retries": 1,
        "flush_cache_between_points": False,
    }
    path = d / f"{name}.yaml"
    path.write_text(json.dumps(exp, indent=1) + "\n")  # JSON is YAML
    return path


def manifest(run_dir: Path | None) -> dict | None:
    try:
        return json.loads((run_dir / "manifest.json").read_text()) if run_dir else None
    except (FileNotFoundError, ValueError):
        return None


def live_servers(srv: Path) -> list[tuple[int, int]]:
    """(pid, port) of the round's servers that are up, from their pidfiles (<workdir>/p<port>/server.pid)."""
    out = []
    for f in srv.glob("p*/server.pid"):
        try:
            pid = int(f.read_text())
        except ValueError:
            continue
        if psutil.pid_exists(pid):
            out.append((pid, int(f.parent.name[1:])))
    return out


def post(url: str, body: dict) -> int:
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status


class Chaos(threading.Thread):
    """Watches a round's manifest; for each attempt of a point that starts, draws a fault and injects it."""

    def __init__(self, rng: random.Random, rnd: int, runs: Path, srv: Path, proc: subprocess.Popen, log):
        super().__init__(daemon=True)
        self.rng, self.rnd, self.runs, self.srv, self.proc, self.log = rng, rnd, runs, srv, proc, log
        self.events: list[dict] = []
        self.missed: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        seen: set[tuple[str, int]] = set()
        run_dir = None
        while not self.stop.is_set() and self.proc.poll() is None:
            run_dir = run_dir or next(
                (d for d in self.runs.glob("*") if (d / "manifest.json").exists()), None
            )
            m = manifest(run_dir)
            running = [
                (k, p["attempts"]) for k, p in (m or {}).get("points", {}).items() if p["status"] == "running"
            ]
            for key in running:
                if key in seen:
                    continue
                seen.add(key)
                kind = self.rng.choices([k for k, _ in FAULTS], [w for _, w in FAULTS])[0]
                delay = self.rng.uniform(0.3, 1.5)
                if kind != "none":
                    time.sleep(delay)
                    self.inject(kind, key, run_dir)
            time.sleep(0.05)

    def miss(self, ev: dict) -> None:
        """A fault drawn that did not land (the attempt ended first, no server up, the workers never both sent)."""
        self.missed.append(ev)
        self.log.write(json.dumps({**ev, "missed": True}) + "\n")

    def workers_sending(self, status: Path, within_s: float = 15.0) -> list[Path]:
        """The status files of the point's two Locust workers once both have sent a request (Locust starts a few
        seconds into the attempt), or [] when that does not happen within `within_s`."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            files = sorted(status.glob("*.json"))
            try:
                if len(files) == 2 and all('"issued": 0,' not in f.read_text() for f in files):
                    time.sleep(self.rng.uniform(0.2, 1.0))  # its streams in flight
                    return files
            except FileNotFoundError:
                return []  # the attempt ended
            time.sleep(0.05)
        return []

    def inject(self, kind: str, key: tuple[str, int], run_dir: Path) -> None:
        m = manifest(run_dir) or {}
        p = m.get("points", {}).get(key[0], {})
        ev = {"round": self.rnd, "point": key[0], "attempt": key[1], "kind": kind, "t": time.time()}
        if p.get("status") != "running" or p.get("attempts") != key[1]:
            self.miss(ev)  # the attempt ended meanwhile
            return
        servers = live_servers(self.srv)
        try:
            if kind == "worker_kill":
                files = self.workers_sending(run_dir / f".tmp-{key[0]}" / ".work" / "status")
                if len(files) < 2:
                    self.miss(ev)
                    return
                ev["pid"] = int(files[0].stem)
                os.kill(ev["pid"], signal.SIGKILL)
            elif not servers:
                self.miss(ev)
                return
            elif kind == "server_kill":
                ev["pid"] = servers[0][0]
                os.killpg(servers[0][0], signal.SIGKILL)
            else:
                body = {"hang": True} if kind == "hang" else {"crawl": 3}
                ev["status"] = post(f"http://127.0.0.1:{servers[0][1]}/sim/fault", body)
        except (OSError, ValueError) as e:
            ev["error"] = f"{type(e).__name__}: {e}"
        self.events.append(ev)
        self.log.write(json.dumps(ev) + "\n")
        self.log.flush()


def ground_truth(gt_dir: Path) -> dict[str, dict]:
    out = {}
    for f in gt_dir.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                g = json.loads(line)
            except ValueError:
                continue  # a line cut by a SIGKILL
            out[g["id"]] = g
    return out


def judge(run_dir: Path, gt: dict[str, dict], events: list[dict]) -> tuple[Counter, list[str]]:
    """Each point's verdict (Counter of outcomes) and the silently wrong ones, said."""
    out: Counter = Counter()
    wrong: list[str] = []
    m = manifest(run_dir) or {"points": {}}
    for pid, p in m["points"].items():
        st = p["status"]
        if st in ("failed", "server_failed"):
            out[st] += 1
            if not p.get("reason"):
                wrong.append(f"{pid}: {st} without a reason")
            continue
        if st != "done":
            out["unfinished"] += 1
            wrong.append(f"{pid}: left {st}")
            continue
        s = json.loads((run_dir / pid / "summary.json").read_text())
        faulted = {e["kind"] for e in events if e["point"] == pid and e["attempt"] == p["attempts"]}
        recs = pq.read_table(run_dir / pid / "records.parquet").to_pylist()
        bad = []
        for r in recs:
            if r["warmup"]:
                continue
            g = gt.get(r["request_id"])
            cls = r["error_class"]
            if cls is None:
                if g is None:
                    bad.append(f"{r['request_id']}: ok, no ground truth")
                elif r["completion_tokens"] != g["completion_tokens"] or r["chunk_tokens"] != [
                    t for _, t in g["chunks"]
                ]:
                    bad.append(f"{r['request_id']}: tokens differ from the emulator's")
                continue
            want = EXPECTED.get((g or {}).get("fault", "") and g["fault"].split(":")[0])
            if want == cls:
                out["classified_request_faults"] += 1
            elif not faulted - {"crawl"} and not (cls == "timeout_first_token" and g is None):
                bad.append(f"{r['request_id']}: {cls}, injected {(g or {}).get('fault')}")
        if s["requests"]["measured"] != REQUESTS and not s.get("degraded"):
            bad.append(f"{s['requests']['measured']} of {REQUESTS} requests measured, not marked degraded")
        if bad:
            wrong.append(f"{pid}: " + "; ".join(bad[:3]))
        outcome = "degraded" if s.get("degraded") else "done"
        out[outcome] += 1
        for k in faulted:
            out[f"{outcome}_after_{k}"] += 1
    return out, wrong


def server_faults(run_dir: Path, events: list[dict]) -> tuple[int, list[str]]:
    """Each server SIGKILL and hang that landed, against the crash the run recorded for its point (`crashes[].what`,
    the orchestrator patch of issue 35): (classified, mismatches said)."""
    m = manifest(run_dir) or {"configs": {}}
    got = Counter(
        (c["point"], c.get("what")) for cfg in m["configs"].values() for c in cfg.get("crashes") or []
    )
    want = Counter(
        (e["point"], {"server_kill": "the server died", "hang": "the server hung"}[e["kind"]])
        for e in events
        if e["kind"] in ("server_kill", "hang") and "error" not in e
    )
    return sum((got & want).values()), [f"{pt}: injected, recorded {what!r} {n} time(s) less" for (pt, what), n in
                                         (want - got).items()]  # fmt: skip


def cleanup(proc: subprocess.Popen, srv: Path) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own session (start_new_session)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    for pid, _port in live_servers(srv):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--minutes", type=float, default=30.0, help="start rounds until then (a round then finishes)"
    )
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument(
        "--out", type=Path, default=None, help="where rounds, logs and chaos.jsonl go (a temp dir)"
    )
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="servesweep-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    t0 = time.monotonic()
    total: Counter = Counter()
    wrong: list[str] = []
    injected: Counter = Counter()
    missed = 0
    rounds = hung = 0
    log = open(out / "chaos.jsonl", "a")  # noqa: SIM115 - closed at the end
    while time.monotonic() - t0 < a.minutes * 60:
        rounds += 1
        d = out / f"round{rounds:03d}"
        rates = ""
        if rng.random() < 0.5:
            rates = ",".join(f"{k}={rng.choice([0.01, 0.02])}" for k in ("429", "500", "disconnect", "error_event",
                                                                          "malformed", "stall:5"))  # fmt: skip
        exp = experiment(d, f"chaos{rounds}", rates)
        log.write(json.dumps({"round": rounds, "request_fault_rates": rates or None}) + "\n")
        runs, srv = d / "runs", d / "srv"
        proc = subprocess.Popen(
            [sys.executable, "-m", "servesweep.cli", "run", str(exp), "--out", str(runs)],
            cwd=d, stdout=open(d / "run.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        )  # fmt: skip
        chaos = Chaos(rng, rounds, runs, srv, proc, log)
        chaos.start()
        try:
            rc = proc.wait(timeout=ROUND_BOUND_S)
        except subprocess.TimeoutExpired:
            rc, hung = None, hung + 1
            wrong.append(f"round {rounds}: servesweep run did not end within {ROUND_BOUND_S} s")
        chaos.stop.set()
        chaos.join(10)
        cleanup(proc, srv)
        run_dir = next((x for x in runs.glob("*") if (x / "manifest.json").exists()), None)
        got, bad = (
            judge(run_dir, ground_truth(d / "gt"), chaos.events) if run_dir else (Counter(), ["no run"])
        )
        if run_dir:
            n, miss = server_faults(run_dir, chaos.events)
            got["server_faults_classified"] += n
            got["server_faults_misclassified"] += len(miss)
            bad += miss
        total += got
        wrong += [f"round {rounds}: {w}" for w in bad]
        injected.update(e["kind"] for e in chaos.events if "error" not in e)
        missed += len(chaos.missed)
        print(f"round {rounds}: exit {rc}, faults {[e['kind'] for e in chaos.events]}, request faults "
              f"{'on' if rates else 'off'}: {dict(got)}; {len(bad)} wrong", flush=True)  # fmt: skip
    log.close()
    points = sum(total[k] for k in ("done", "degraded", "failed", "server_failed", "unfinished"))
    figures = {
        "minutes": round((time.monotonic() - t0) / 60, 1), "seed": a.seed, "rounds": rounds, "points": points,
        "injected": dict(injected), "missed": missed, "outcomes": dict(total), "silently_wrong": len(wrong), "rounds_hung": hung,
        "out": str(out),
    }  # fmt: skip
    for w in wrong:
        print("WRONG", w)
    print(json.dumps(figures))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

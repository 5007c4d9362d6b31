"""Chaos soak (issue 35; not CI): emulated matrices across hosts with faults injected at random, every point judged.

    nice -n 10 .venv/bin/python bench/bench_chaos.py --minutes 30 [--seed 35] [--out DIR] [--hosts 2|1]

Rounds of `servesweep run` (a real matrix through Ansible: 2 server configurations x 2 concurrencies) against the
emulator behind a generic launcher that writes each server's ground truth (`--sim-ground-truth`; real time, ~15 ms
a token). `--hosts 2` (the default): the run, its Locust master and the servers on host `master`, one Locust worker
on each of hosts `w1` and `w2`, started over SSH by the locust_worker role (`load.worker_hosts`), each host a
network namespace with its own address and sshd (tests/netns.py; Ansible's SSH relays from a fourth host, `ctl`,
so a master<->worker cut leaves the worker reachable for its stop, as in a lab). `--hosts 1`: 2 local workers.

Each round draws its per-request fault rates (none, or 1-2 % each of 429, 500, disconnect, error_event, malformed,
stall:5) and, for every attempt of a point that starts, one of (0.3-1.5 s into the attempt):
- nothing;
- server faults: a SIGKILL of the server's process group (by its pidfile), a hang (`POST /sim/fault
  {"hang": true}`), a crawl (`{"crawl": 3}`);
- `worker_kill`: a SIGKILL of one Locust worker (by the pid its status or pid file names; on a worker host);
- host faults (2 hosts): `host_death` (the worker host's link down and every process in it SIGKILLed; the host
  comes back once the attempt ended), `cut_short` (every packet between the master and the worker host dropped
  for 2-4 s, less than the worker's master silence: the worker returns and must be counted once), `cut_long`
  (15 s, past the silence: the worker stops itself and is lost);
- `orchestrator_kill`: a SIGKILL of `servesweep run` (its whole session), then at once `servesweep run --resume`
  (faults go on in the resumed run), or, drawn, nothing until the end of the soak.
Everything is drawn from one seeded generator and logged (`chaos.jsonl` in the out folder, one line per
injection with its time and target). Only processes the soak started are killed: the run's own session, the
servers named by its pidfiles, the processes of the soak's own namespaces.

Every point of every round is judged:
- `done`: its records are checked against the emulator's ground truth: every successful record's completion
  tokens and per-chunk token counts exactly; every failed record's class is the one its injected per-request
  fault gives, or the point had a server, worker or host fault; no request recorded twice; measured requests =
  asked, unless the point is degraded. A done point that fails any of it is **silently wrong**;
- `degraded` (done, marked: `problems` say which worker was lost and what it cost): its records must still match
  the ground truth and none may count twice;
- `failed` / `server_failed`: marked, with a reason;
- anything else (a point left pending or running): unfinished, a failure of the soak;
and every server SIGKILL and hang that landed must be in the manifest as a crash of its point that says `the
server died` or `the server hung` (the configuration's `crashes[].what`).
A round that does not end within its bound (every wait in servesweep is bounded) is killed and counted as hung.
At the end, `servesweep run --resume` (no faults) of every run folder left interrupted or with points not run
must finish it: every point then done, degraded or failed with its reason (judged again).

Prints one JSON line of figures and exits 1 when a point was silently wrong, unfinished, a round hung or a resume
did not complete its run.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
MODEL = "Qwen/Qwen3.6-27B"
STALL_S = 3.0
EXPECTED = {  # injected per-request fault -> the record's class (tests/matrix/test_reliability_faults.py)
    "429": "http_429",
    "500": "http_5xx",
    "disconnect": "connection_reset",
    "error_event": "stream_error_event",
    "malformed": "malformed_chunk",
    "stall": "timeout_stall",  # 5 s > stall_s 3 s
}
FAULTS_LOCAL = (("none", 0.3), ("server_kill", 0.15), ("hang", 0.15), ("crawl", 0.15), ("worker_kill", 0.25))
FAULTS_HOSTS = (
    ("none", 0.16),
    ("server_kill", 0.08),
    ("hang", 0.08),
    ("crawl", 0.08),
    ("worker_kill", 0.12),
    ("host_death", 0.12),
    ("cut_short", 0.12),
    ("cut_long", 0.12),
    ("orchestrator_kill", 0.12),
)
HOST_FAULTS = {"worker_kill", "host_death", "cut_short", "cut_long", "orchestrator_kill"}
WORKER_HOSTS = ("w1", "w2")
# The workers' master silence (role variable; 15 s by default) and the cuts around it
MASTER_SILENCE_S = 8
CUT_SHORT_S = (2.0, 4.0)
CUT_LONG_S = 15.0
ORCH_KILLS_PER_ROUND = 2  # at most; the next drawn one is injected as nothing

WRAPPER = """#!/bin/sh
py="$1"; model="$2"; host="$3"; port="$4"; shift 4
{env}exec "$py" -m servesweep.sim --model-path "$model" --host {bind} --port "$port" --sim-load-time 0.1 \\
  --sim-seed $$ --sim-ground-truth {gt}/$port-$$.jsonl {rates} "$@"
"""


class Mode:
    """What differs between the local soak and the 2-host one."""

    def __init__(
        self, hosts: int, out: Path, requests: int | None = None, configs: tuple[int, ...] = (8, 16)
    ):
        self.hosts = hosts
        # 2 hosts: points long enough (~12-24 s of load) that a worker cut off for 2-4 s returns before its
        # master ends the point
        self.requests = requests or (12 if hosts == 1 else 48)
        self.configs = list(configs)  # max_running_requests of each server configuration
        self.faults = FAULTS_LOCAL if hosts == 1 else FAULTS_HOSTS
        self.net = None  # netns.Net (2 hosts)
        self.inventory: Path | None = None
        self.out = out

    @property
    def master_addr(self) -> str:
        return self.net["master"].addr if self.net else "127.0.0.1"

    def prefix(self) -> list[str]:
        """How a command runs on the master host (nothing: this machine)."""
        return self.net["master"].prefix() if self.net else []

    def setup(self, stack: contextlib.ExitStack) -> None:
        if self.hosts == 1:
            return
        sys.path.insert(0, str(ROOT / "tests"))
        import netns

        self.net = stack.enter_context(netns.hosts(["master", *WORKER_HOSTS, "ctl"], ssh=list(WORKER_HOSTS)))
        # The hosts share this machine's disk: the role installs servesweep from a wheel of this checkout into a
        # fresh environment per host and takes its dependencies from this environment (no index, no network).
        site = [p for p in sys.path if p.endswith("site-packages")]
        lines = ["[loadgen]"]
        lines += [
            f"{h} ansible_host={self.net[h].addr} locust_worker_dir={self.out}/hosts/{h}"
            for h in WORKER_HOSTS
        ]
        lines += ["[loadgen:vars]", self.net.inventory_vars(via="ctl").rstrip("\n")]
        lines += [
            f"locust_worker_python={sys._base_executable}",
            "locust_worker_pip_from_base=true",
            f"locust_worker_site_dirs={json.dumps(site)}",
            "locust_worker_start_timeout=60",
            "locust_worker_stop_timeout=10",
            f"locust_worker_master_silence_s={MASTER_SILENCE_S}",
        ]
        self.inventory = self.out / "hosts.ini"
        self.inventory.write_text("\n".join(lines) + "\n")


def experiment(d: Path, name: str, rates: str, mode: Mode, master_port: int) -> Path:
    (d / "gt").mkdir(parents=True)
    wrapper = d / "server.sh"
    env = f"export PYTHONPATH={os.environ['PYTHONPATH']}\n" if os.environ.get("PYTHONPATH") else ""
    wrapper.write_text(
        WRAPPER.format(
            gt=d / "gt",
            rates=f"--sim-fault-rate {rates}" if rates else "",
            env=env,
            # on the master host the workers of the other hosts reach it at the host's address
            bind='"$host"' if mode.hosts == 1 else "0.0.0.0",
        )
    )
    load: dict = {
        "concurrency": [2, 4],
        "prompt_tokens": [64],
        "output_tokens": [64],
        "requests": mode.requests,
        "first_token_s": 3,
        "stall_s": STALL_S,
        "total_s": 30,
        "max_failure_rate": 0.5,
    }
    if mode.hosts == 1:
        load["workers"] = 2
    else:
        load["worker_hosts"] = {
            "inventory": str(mode.inventory),
            "group": "loadgen",
            "per_host": 1,
            "master_host": mode.master_addr,
            "master_port": master_port,
        }
    exp = {
        "name": name,
        "target": {"inventory": "local", "port": 0, "address": mode.master_addr},
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
        "server": {"base": {"context_length": 4096}, "axes": {"max_running_requests": mode.configs}},
        "load": load,
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


def find_run(runs: Path) -> Path | None:
    return next((x for x in runs.glob("*") if (x / "manifest.json").exists()), None)


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


def post_fault(mode: Mode, port: int, body: dict) -> int:
    """POST /sim/fault to the server on the master host (from inside it: the server may bind its loopback)."""
    code = (
        "import json,sys,urllib.request\n"
        f"r=urllib.request.Request('http://127.0.0.1:{port}/sim/fault',{json.dumps(body).encode()!r},"
        "{'content-type':'application/json'})\n"
        "print(urllib.request.urlopen(r,timeout=5).status)\n"
    )
    r = subprocess.run([*mode.prefix(), sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    if r.returncode != 0:
        raise OSError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return int(r.stdout.strip())


def run_cmd(mode: Mode, args: list[str], log: Path) -> subprocess.Popen:
    """`servesweep run ...` on the master host, in a session of its own (what an orchestrator SIGKILL kills)."""
    with open(log, "ab") as f:
        return subprocess.Popen(
            [*mode.prefix(), sys.executable, "-m", "servesweep.cli", "run", *args],
            cwd=log.parent, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        )  # fmt: skip


class Chaos(threading.Thread):
    """Watches a round's manifest; for each attempt of a point that starts, draws a fault and injects it."""

    def __init__(self, rng: random.Random, rnd: int, runs: Path, srv: Path, mode: Mode, log,
                 force: list[str] | None = None):  # fmt: skip
        super().__init__(daemon=True)
        self.rng, self.rnd, self.runs, self.srv, self.mode, self.log = rng, rnd, runs, srv, mode, log
        self.force = list(force or [])  # kinds to inject first, in order (the smoke test's)
        self.proc: subprocess.Popen | None = None  # the servesweep run (or resume) now running
        self.events: list[dict] = []
        self.missed: list[dict] = []
        self.stop = threading.Event()
        self.orch_killed = threading.Event()  # set when an orchestrator SIGKILL landed; cleared by the round
        self.orch_kills = 0
        self.defer_resume = False  # the last orchestrator kill is resumed only at the end of the soak
        self.helpers: list[threading.Thread] = []  # cuts and revivals under way
        self.lock = threading.Lock()

    def running(self) -> bool:
        return not self.stop.is_set() and self.proc is not None and self.proc.poll() is None

    def run(self) -> None:
        seen: set[tuple[str, int]] = set()
        run_dir = None
        while not self.stop.is_set():
            if not self.running():
                time.sleep(0.05)
                continue
            run_dir = run_dir or find_run(self.runs)
            m = manifest(run_dir)
            running = [
                (k, p["attempts"]) for k, p in (m or {}).get("points", {}).items() if p["status"] == "running"
            ]
            for key in running:
                if key in seen:
                    continue
                seen.add(key)
                if self.force:
                    kind = self.force.pop(0)
                else:
                    kind = self.rng.choices(
                        [k for k, _ in self.mode.faults], [w for _, w in self.mode.faults]
                    )[0]
                delay = self.rng.uniform(0.3, 1.5)
                if kind.startswith("orchestrator_kill") and self.orch_kills >= ORCH_KILLS_PER_ROUND:
                    kind = "none"
                if kind != "none":
                    time.sleep(delay)
                    self.inject(kind, key, run_dir)
            time.sleep(0.05)

    def write(self, ev: dict) -> None:
        with self.lock:
            self.log.write(json.dumps(ev) + "\n")
            self.log.flush()

    def miss(self, ev: dict) -> None:
        """A fault drawn that did not land (the attempt ended first, no server up, the workers never sent)."""
        self.missed.append(ev)
        self.write({**ev, "missed": True})

    def attempt_running(self, run_dir: Path, key: tuple[str, int]) -> bool:
        p = (manifest(run_dir) or {}).get("points", {}).get(key[0], {})
        return p.get("status") == "running" and p.get("attempts") == key[1]

    def local_workers_sending(self, status: Path, within_s: float = 15.0) -> list[Path]:
        """The status files of the point's two local Locust workers once both have sent a request (Locust starts
        a few seconds into the attempt), or [] when that does not happen within `within_s`."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and self.running():
            files = sorted(status.glob("*.json"))
            try:
                if len(files) == 2 and all('"issued": 0,' not in f.read_text() for f in files):
                    time.sleep(self.rng.uniform(0.2, 1.0))  # its streams in flight
                    return files
            except FileNotFoundError:
                return []  # the attempt ended
            time.sleep(0.05)
        return []

    def remote_worker_sending(
        self, host: str, since: float, attempt: Callable[[], bool] | None = None, within_s: float = 240.0
    ) -> int | None:
        """The pid of worker 1 on `host` once it sent a request of this attempt (its files are newer than the
        attempt's start; the role starts it over SSH, seconds into the attempt), else None: the attempt ended
        (`attempt()` false) or `within_s` passed. The bound is generous: on a loaded 2-core machine the workers'
        start over SSH took over a minute, and a 60 s bound missed a forced fault whose attempt was still running."""
        d = self.mode.out / "hosts" / host
        deadline = time.monotonic() + within_s
        polls = 0
        while time.monotonic() < deadline and self.running():
            polls += 1
            if attempt is not None and polls % 10 == 0 and not attempt():
                return None
            try:
                st = d / "1.status.json"
                if st.stat().st_mtime >= since and json.loads(st.read_text()).get("issued", 0) > 0:
                    time.sleep(self.rng.uniform(0.2, 1.0))
                    return int((d / "1.pid").read_text())
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        return None

    def after_attempt(self, run_dir: Path, key: tuple[str, int], then, bound_s: float = 240.0) -> None:
        """Run `then()` in a thread once the attempt is no longer running (or the round stopped), bounded."""

        def wait() -> None:
            end = time.monotonic() + bound_s
            while time.monotonic() < end and not self.stop.is_set() and self.attempt_running(run_dir, key):
                time.sleep(0.2)
            then()

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        self.helpers.append(t)

    def inject(self, kind: str, key: tuple[str, int], run_dir: Path) -> None:
        since = time.time() - 3.0  # the attempt started before we saw it running
        ev: dict = {"round": self.rnd, "point": key[0], "attempt": key[1], "kind": kind}
        if not self.attempt_running(run_dir, key):
            self.miss({**ev, "t": time.time()})  # the attempt ended meanwhile
            return
        net = self.mode.net
        try:
            if kind == "worker_kill" and net is None:
                files = self.local_workers_sending(run_dir / f".tmp-{key[0]}" / ".work" / "status")
                if len(files) < 2:
                    return self.miss({**ev, "t": time.time()})
                ev["target"] = f"pid {int(files[0].stem)}"
                os.kill(int(files[0].stem), signal.SIGKILL)
            elif kind in ("worker_kill", "host_death", "cut_short", "cut_long"):
                host = self.rng.choice(WORKER_HOSTS)
                pid = self.remote_worker_sending(host, since, lambda: self.attempt_running(run_dir, key))
                if pid is None or not self.attempt_running(run_dir, key):
                    return self.miss({**ev, "target": host, "t": time.time()})
                if kind == "worker_kill":
                    ev["target"] = f"{host} worker pid {pid}"
                    os.kill(pid, signal.SIGKILL)
                elif kind == "host_death":
                    ev["target"] = host
                    ev["pids_killed"] = len(net.kill_host(host))
                    self.after_attempt(run_dir, key, lambda h=host: self.revive(h))
                else:
                    secs = self.rng.uniform(*CUT_SHORT_S) if kind == "cut_short" else CUT_LONG_S
                    ev["target"], ev["seconds"] = f"master<->{host}", round(secs, 2)
                    net.cut("master", host)
                    self.heal_later(host, secs)
            elif kind.startswith("orchestrator_kill"):
                # forced as orchestrator_kill:now or :end (the smoke test's), else drawn
                kind, _, when = kind.partition(":")
                ev["kind"] = kind
                if (
                    net is not None and self.rng.random() < 0.7
                ):  # mostly mid-load, else wherever the attempt is
                    self.remote_worker_sending(
                        self.rng.choice(WORKER_HOSTS), since, lambda: self.attempt_running(run_dir, key)
                    )
                    if not self.attempt_running(run_dir, key):
                        return self.miss({**ev, "t": time.time()})
                ev["target"] = f"servesweep run pid {self.proc.pid}"
                self.orch_kills += 1
                self.defer_resume = when == "end" if when else self.rng.random() < 0.3
                ev["resume"] = "at the end of the soak" if self.defer_resume else "at once"
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.orch_killed.set()
            else:
                servers = live_servers(self.srv)
                if not servers:
                    return self.miss({**ev, "t": time.time()})
                if kind == "server_kill":
                    ev["target"] = f"server pid {servers[0][0]}"
                    os.killpg(servers[0][0], signal.SIGKILL)
                else:
                    body = {"hang": True} if kind == "hang" else {"crawl": 3}
                    ev["target"] = f"server port {servers[0][1]}"
                    ev["status"] = post_fault(self.mode, servers[0][1], body)
        except (OSError, ValueError, RuntimeError) as e:
            ev["error"] = f"{type(e).__name__}: {e}"
        ev["t"] = time.time()
        self.events.append(ev)
        self.write(ev)

    def revive(self, host: str) -> None:
        try:
            self.mode.net.revive(host)
            self.write({"round": self.rnd, "kind": "revived", "target": host, "t": time.time()})
        except (OSError, RuntimeError) as e:
            self.write(
                {"round": self.rnd, "kind": "revived", "target": host, "error": str(e), "t": time.time()}
            )

    def heal_later(self, host: str, secs: float) -> None:
        def heal() -> None:
            time.sleep(secs)
            self.mode.net.heal("master", host)
            self.write({"round": self.rnd, "kind": "healed", "target": f"master<->{host}", "t": time.time()})

        t = threading.Thread(target=heal, daemon=True)
        t.start()
        self.helpers.append(t)

    def settle(self) -> None:
        """Every cut healed and every dead host back before the next round (the helpers are bounded)."""
        self.stop.set()
        for t in self.helpers:
            t.join(CUT_LONG_S + 30)


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


def judge(run_dir: Path, gt: dict[str, dict], events: list[dict], asked: int) -> tuple[Counter, list[str]]:
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
        faulted = {e["kind"] for e in events if e.get("point") == pid and e["attempt"] == p["attempts"]}
        recs = pq.read_table(run_dir / pid / "records.parquet").to_pylist()
        bad = []
        ids = Counter(r["request_id"] for r in recs)
        twice = [i for i, n in ids.items() if n > 1]
        if twice:
            bad.append(f"{len(twice)} request(s) recorded twice, e.g. {twice[0]}")
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
        measured = s["requests"]["measured"]
        if measured != asked and not s.get("degraded"):
            bad.append(f"{measured} of {asked} requests measured, not marked degraded")
        if s.get("degraded") and not s.get("problems"):
            bad.append("degraded without a problem saying why")
        if measured > asked:
            bad.append(f"{measured} requests measured, {asked} asked")
        if bad:
            wrong.append(f"{pid}: " + "; ".join(bad[:3]))
        outcome = "degraded" if s.get("degraded") else "done"
        out[outcome] += 1
        for k in faulted:
            out[f"{outcome}_after_{k}"] += 1
    return out, wrong


def server_faults(run_dir: Path, events: list[dict]) -> tuple[int, list[str]]:
    """Each server SIGKILL and hang that landed, against the crash the run recorded for its point (`crashes[].what`,
    the orchestrator patch of issue 35): (classified, mismatches said). A kill or hang whose run was SIGKILLed
    during the same attempt is not owed a record (the run that would have written it died)."""
    m = manifest(run_dir) or {"configs": {}}
    got = Counter(
        (c["point"], c.get("what")) for cfg in m["configs"].values() for c in cfg.get("crashes") or []
    )
    orch = {(e["point"], e["attempt"]) for e in events if e["kind"] == "orchestrator_kill"}
    want = Counter(
        (e["point"], {"server_kill": "the server died", "hang": "the server hung"}[e["kind"]])
        for e in events
        if e["kind"] in ("server_kill", "hang")
        and "error" not in e
        and (e["point"], e["attempt"]) not in orch
    )
    return sum((got & want).values()), [f"{pt}: injected, recorded {what!r} {n} time(s) less" for (pt, what), n in
                                         (want - got).items()]  # fmt: skip


def kill_run(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own session (start_new_session)
        proc.wait(timeout=30)


def kill_servers(srv: Path) -> None:
    for pid, _port in live_servers(srv):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def incomplete(m: dict | None) -> bool:
    return (
        m is None
        or m.get("status") != "finished"
        or any(p["status"] in ("pending", "running") for p in m.get("points", {}).values())
    )


class Round:
    """One round: its folder, experiment, chaos thread and verdict."""

    def __init__(
        self, n: int, out: Path, rng: random.Random, mode: Mode, log, force: list[str] | None = None
    ):
        self.n, self.d, self.mode = n, out / f"round{n:03d}", mode
        rates = ""
        if rng.random() < 0.5:
            rates = ",".join(f"{k}={rng.choice([0.01, 0.02])}" for k in ("429", "500", "disconnect", "error_event",
                                                                          "malformed", "stall:5"))  # fmt: skip
        self.rates = rates
        self.exp = experiment(self.d, f"chaos{n}", rates, mode, master_port=5600 + n % 300)
        log.write(json.dumps({"round": n, "request_fault_rates": rates or None, "t": time.time()}) + "\n")
        self.runs, self.srv = self.d / "runs", self.d / "srv"
        self.chaos = Chaos(rng, n, self.runs, self.srv, mode, log, force)
        self.rc: int | None = None
        self.hung = False
        self.resumes = 0
        self.left_for_resume = False

    def play(self, bound_s: float) -> None:
        """servesweep run, with a resume after each orchestrator kill (unless drawn for the end), bounded."""
        chaos = self.chaos
        chaos.proc = run_cmd(self.mode, [str(self.exp), "--out", str(self.runs)], self.d / "run.log")
        chaos.start()
        end = time.monotonic() + bound_s
        while True:
            try:
                self.rc = chaos.proc.wait(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.hung = True
                break
            if not chaos.orch_killed.is_set():
                break
            chaos.orch_killed.clear()
            run_dir = find_run(self.runs)
            if chaos.defer_resume or run_dir is None:
                self.left_for_resume = run_dir is not None
                break
            self.resumes += 1
            chaos.proc = run_cmd(self.mode, ["--resume", str(run_dir)], self.d / "run.log")
        chaos.settle()
        kill_run(chaos.proc)
        kill_servers(self.srv)  # a killed run's server; the resume restarts it anyway

    def verdict(self) -> tuple[Counter, list[str]]:
        run_dir = find_run(self.runs)
        if run_dir is None:
            return Counter(), [f"round {self.n}: no run"]
        got, bad = judge(run_dir, ground_truth(self.d / "gt"), self.chaos.events, self.mode.requests)
        n, miss = server_faults(run_dir, self.chaos.events)
        got["server_faults_classified"] += n
        got["server_faults_misclassified"] += len(miss)
        return got, [f"round {self.n}: {w}" for w in bad + miss]

    def resume(self, bound_s: float = 600) -> dict:
        """The end of the soak: `servesweep run --resume` without faults; it must finish the run."""
        run_dir = find_run(self.runs)
        t0 = time.monotonic()
        before = Counter(p["status"] for p in (manifest(run_dir) or {}).get("points", {}).values())
        proc = run_cmd(self.mode, ["--resume", str(run_dir)], self.d / "resume.log")
        try:
            rc = proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            rc = None
        kill_run(proc)
        kill_servers(self.srv)
        m = manifest(run_dir)
        after = Counter(p["status"] for p in (m or {}).get("points", {}).values())
        return {"round": self.n, "rc": rc, "s": round(time.monotonic() - t0, 1), "before": dict(before),
                "after": dict(after), "finished": not incomplete(m)}  # fmt: skip


def soak(minutes: float, seed: int, out: Path, hosts: int = 2, force: list[str] | None = None,
         rounds_max: int | None = None, requests: int | None = None, configs: tuple[int, ...] = (8, 16)) -> dict:  # fmt: skip
    """The soak; returns its figures (`wrong`: the silently wrong points, said). `force`: fault kinds injected
    first, in order, before the seeded draws (`orchestrator_kill:now` / `:end`: resumed at once / at the end);
    `rounds_max`: stop after that many rounds; `requests`, `configs`: each point's requests, the configurations'
    max_running_requests (a smaller matrix for the smoke test)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    t0 = time.monotonic()
    total: Counter = Counter()
    wrong: list[str] = []
    injected: Counter = Counter()
    missed: Counter = Counter()
    played: list[Round] = []
    hung = 0
    mode = Mode(hosts, out, requests, configs)
    bound_s = 420 if hosts == 1 else 900
    with contextlib.ExitStack() as stack, open(out / "chaos.jsonl", "a") as log:
        mode.setup(stack)
        force = list(force or [])
        while time.monotonic() - t0 < minutes * 60 and (rounds_max is None or len(played) < rounds_max):
            r = Round(len(played) + 1, out, rng, mode, log, force)
            played.append(r)
            r.play(bound_s)
            force = r.chaos.force  # what this round did not get to
            hung += r.hung
            if r.hung:
                wrong.append(f"round {r.n}: servesweep run did not end within {bound_s} s")
            injected.update(e["kind"] for e in r.chaos.events if "error" not in e)
            missed.update(e["kind"] for e in r.chaos.missed)
            if r.left_for_resume:
                msg = "left interrupted for the final resume"
            else:
                got, bad = r.verdict()
                total += got
                wrong += bad
                msg = f"{dict(got)}; {len(bad)} wrong"
            print(f"round {r.n}: exit {r.rc}, faults {[e['kind'] for e in r.chaos.events]}, request faults "
                  f"{'on' if r.rates else 'off'}, {r.resumes} resume(s): {msg}", flush=True)  # fmt: skip
        # The end: every run folder left interrupted or unfinished gets a resume without faults
        resumes = []
        for r in played:
            if r.hung or incomplete(manifest(find_run(r.runs))):
                res = r.resume()
                resumes.append(res)
                print(f"final resume of round {r.n}: {res}", flush=True)
                if not res["finished"]:
                    wrong.append(f"round {r.n}: the final resume did not finish its run ({res})")
                if r.left_for_resume or r.hung:
                    got, bad = r.verdict()
                    total += got
                    wrong += bad
        errors = [e for r in played for e in r.chaos.events if "error" in e]
    points = sum(total[k] for k in ("done", "degraded", "failed", "server_failed", "unfinished"))
    return {
        "minutes": round((time.monotonic() - t0) / 60, 1), "seed": seed, "hosts": hosts, "rounds": len(played),
        "points": points, "injected": dict(injected), "missed": dict(missed), "injection_errors": len(errors),
        "outcomes": dict(total), "final_resumes": len(resumes),
        "final_resumes_finished": sum(r["finished"] for r in resumes), "final_resume_runs": resumes,
        "silently_wrong": len(wrong),
        "rounds_hung": hung, "out": str(out), "wrong": wrong, "runs": [str(find_run(r.runs)) for r in played],
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--minutes", type=float, default=30.0, help="start rounds until then (a round then finishes)"
    )
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--hosts", type=int, choices=(1, 2), default=2, help="2: workers on 2 emulated hosts")
    ap.add_argument(
        "--out", type=Path, default=None, help="where rounds, logs and chaos.jsonl go (a temp dir)"
    )
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="servesweep-chaos-"))
    figures = soak(a.minutes, a.seed, out, hosts=a.hosts)
    figures.pop("runs")
    for w in figures.pop("wrong"):
        print("WRONG", w)
    print(json.dumps(figures))
    return 1 if figures["silently_wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())

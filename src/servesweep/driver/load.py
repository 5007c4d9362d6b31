"""One load point as a real headless Locust subprocess (`run_point`), and `servesweep load` (points and sweeps).

This module never imports Locust or gevent at module level: the orchestrator calls `run_point` from a process that
must stay unpatched. Locust runs `servesweep/client/locustfile.py` in a child process; the records it writes, not its exit
status, decide what happened.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import click

from servesweep.config.point import LoadPoint

LOCUSTFILE = Path(__file__).resolve().parents[1] / "client" / "locustfile.py"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
# where --api-key-file's key travels to the Locust child (its environment)
FILE_KEY_ENV = "SERVESWEEP_API_KEY"
DEFAULT_SIM_MODEL = "Qwen/Qwen3.6-27B"
DEFAULT_SIM_ARGS = f"--model-path {DEFAULT_SIM_MODEL} --enable-cache-report"


# ---------------------------------------------------------------- small HTTP helpers (stdlib: no gevent here)


def api_key_for(point: LoadPoint) -> str | None:
    """The API key from the environment variable the point names (never from the point itself)."""
    name = point.api_key_env
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise ValueError(f"api_key_env: the environment variable {name} is not set or empty")
    return key


def _request(point: LoadPoint, path: str, body: dict | None = None, timeout: float = 30.0):
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    headers.update(point.headers)
    key = api_key_for(point)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        point.base_url + path, data=data, headers=headers, method="POST" if data else "GET"
    )
    return urllib.request.urlopen(req, timeout=timeout)


_TRANSIENT = re.compile(r"HTTP (429|5\d\d)|cannot reach|timed out|Connection (reset|refused)", re.I)
PROBE_ATTEMPTS = 4  # 0.5 + 1 + 2 s of back-off: a server that sheds a request now and then still gets probed


class _Transient(RuntimeError):
    """A probe failure worth another try whatever its message says (an in-stream error event)."""


class ProbeLog:
    """What the probes of a point did: requests sent per probe (each attempt is one request) and notes for the
    summary (a model name the server does not list)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.notes: list[str] = []

    def count(self, kind: str) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + 1

    def as_dict(self) -> dict:
        return {"requests": dict(self.requests), "total": sum(self.requests.values())}


def _retrying(what: str, fn: Callable[[], object], log: ProbeLog | None = None, kind: str | None = None):
    """Run a probe, retrying what looks transient (429, 5xx, a refused or reset connection, a timeout)."""
    delay = 0.5
    for attempt in range(1, PROBE_ATTEMPTS + 1):
        try:
            if log is not None and kind:
                log.count(kind)
            return fn()
        except (RuntimeError, OSError) as e:
            transient = isinstance(e, _Transient) or _TRANSIENT.search(str(e))
            if attempt == PROBE_ATTEMPTS or not transient:
                raise RuntimeError(f"{what} (attempt {attempt} of {PROBE_ATTEMPTS}): {e}") from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def list_models(point: LoadPoint, log: ProbeLog | None = None) -> list[str]:
    """The model ids the server lists at GET /v1/models."""

    def once() -> dict:
        try:
            with _request(point, "/v1/models", timeout=point.connect_s + 20) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(
                f"{point.base_url}/v1/models answered HTTP {e.code}: {e.read()[:200]!r}"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"{point.base_url}/v1/models: cannot reach the server ({e})") from None

    d = _retrying("listing models", once, log, "models")
    models = d.get("data") or [] if isinstance(d, dict) else []
    return [m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]]


def fetch_model(point: LoadPoint, log: ProbeLog | None = None) -> str:
    """The first model the server lists at GET /v1/models."""
    ids = list_models(point, log)
    if not ids:
        raise RuntimeError(f"{point.base_url}/v1/models lists no model; give --model")
    return ids[0]


def check_model(point: LoadPoint, log: ProbeLog) -> None:
    """A model name the server does not list gets a note (a warning, not an error: some servers serve any name,
    or list nothing); a server whose list cannot be read is left alone."""
    try:
        ids = list_models(point, log)
    except RuntimeError:
        return
    if ids and point.model not in ids:
        log.notes.append(
            f"model {point.model!r} is not among the models {point.base_url}/v1/models lists "
            f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}); the server may reject or re-route it"
        )


def probe_continuous_usage(point: LoadPoint, log: ProbeLog | None = None) -> bool:
    """Whether the server adds per-chunk usage with stream_options.continuous_usage_stats (SGLang, vLLM do).
    A server that rejects the option (4xx) does not; 429/5xx and connection errors are retried. The stream is read
    to its end (2 tokens), so the request ends as a normal one does: closing it early would count as an abort in
    the server's own metrics (SGLang's num_aborted_requests_total)."""
    body = {
        "model": point.model,
        "stream": True,
        "max_tokens": 2,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if point.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Say hi."}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Say hi."
        path = "/v1/completions"

    def once() -> bool:
        found = False
        try:
            with _request(point, path, body, timeout=point.first_token_s) as r:
                for raw in r:
                    line = raw.strip()
                    if line.startswith(b"data:") and line[5:].strip() == b"[DONE]":
                        break
                    if not line.startswith(b"data:"):
                        continue
                    try:
                        ev = json.loads(line[5:])
                    except ValueError:
                        continue
                    if not isinstance(ev, dict):
                        continue
                    if "error" in ev:  # an in-stream error (an overloaded server): try again
                        raise _Transient(f"per-chunk usage probe: in-stream error {ev['error']}")
                    for ch in ev.get("choices") or ():
                        d = ch.get("delta") or {}
                        if (d.get("content") or d.get("reasoning_content") or ch.get("text")) and ev.get(
                            "usage"
                        ):
                            found = True  # read on to the end: an early close is an abort to the server
                r.read()  # whatever follows [DONE] (nothing, on a well-behaved server)
        except urllib.error.HTTPError as e:
            if e.code == 429 or e.code >= 500:
                raise RuntimeError(f"per-chunk usage probe: POST {path} answered HTTP {e.code}") from None
            return False  # the option itself was refused
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"per-chunk usage probe: cannot reach {point.base_url} ({e})") from None
        return found

    return bool(_retrying("probing per-chunk usage", once, log, "continuous_usage"))


def resolve_point(point: LoadPoint, log: ProbeLog | None = None) -> LoadPoint:
    """Fill what the point leaves to the server: model name, chat template overhead, continuous usage support.
    Each probe is one small request, retried when the failure looks transient; `log` counts them (and notes a
    model name the server does not list)."""
    upd: dict = {}
    log = log if log is not None else ProbeLog()
    if not point.probe:
        return (
            point
            if point.continuous_usage is not None
            else point.model_copy(update={"continuous_usage": False})
        )
    if point.model is None:
        upd["model"] = fetch_model(point, log)
        point = point.model_copy(update=upd)
    elif (
        point.template_overhead is None or point.continuous_usage is None
    ):  # not resolved before: check it once
        check_model(point, log)
    if point.template_overhead is None and point.endpoint == "chat":
        tpl_extra = {k: v for k, v in request_extra(point).items() if k == "chat_template_kwargs"}
        from servesweep.workload.prompts import probe_template_overhead

        upd["template_overhead"] = int(
            _retrying(
                "probing the chat template overhead",
                lambda: probe_template_overhead(
                    point.base_url,
                    point.model,
                    api_key=api_key_for(point),
                    endpoint="chat",
                    tokenizer=point.tokenizer,
                    extra={**point.extra_body, **tpl_extra} or None,
                ),
                log,
                "template_overhead",
            )
        )
    if point.continuous_usage is None and point.endpoint == "generate":
        upd["continuous_usage"] = False  # /generate says its counts in every event's meta_info anyway
    elif point.continuous_usage is None:
        upd["continuous_usage"] = probe_continuous_usage(point.model_copy(update=upd), log)
    return point.model_copy(update=upd) if upd else point


def request_extra(point: LoadPoint) -> dict:
    """Body fields besides model/messages/max tokens (servesweep.workload.build.request_extra)."""
    from servesweep.workload.build import request_extra as extra

    return extra(point)


def build_bodies(point: LoadPoint) -> tuple[list[tuple[bytes, bytes]], int]:
    """Pre-encoded request bodies of the point's workload: per prompt (head, tail) around the nonce, and the nonce
    length in digits (0 when cache busting is off). `servesweep.workload.build.build_workload` has the rest."""
    from servesweep.workload.build import build_workload

    w = build_workload(point)
    return w.bodies, w.nonce_digits


# ---------------------------------------------------------------- one point


class PointFailed(RuntimeError):
    """The Locust process produced no records (it crashed or could not start)."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP reached `servesweep load` (a BaseException, like KeyboardInterrupt: nothing on the
    way up mistakes it for a failed probe). `signum` gives the exit status 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# after SIGTERM, Locust writes the records of what finished at once (its quitting hook), then waits for the streams
# in flight up to its stop timeout: this long, then the group is SIGKILLed (the load must stop within seconds)
STOP_GRACE_S = float(os.environ.get("SERVESWEEP_STOP_GRACE_S", "5"))


def _kill_group(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """SIGTERM the process group Locust leads (start_new_session), SIGKILL it after grace_s."""
    grace_s = STOP_GRACE_S if grace_s is None else grace_s
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # forked workers may outlive their master: the whole group
    except ProcessLookupError:
        pass
    proc.wait()


def keep_partial(work: Path, out_dir: Path, point_id: str, reason: str) -> dict:
    """An interrupted point: the records Locust wrote (what finished before the stop) go next to its log as
    `records.partial.parquet`, described by `interrupted.json`; `.work/` is removed. Returns that description."""
    from servesweep.results.store import write_json_atomic

    info: dict = {"point_id": point_id, "reason": reason, "records": None, "rows": None}
    rec = work / "records.parquet"
    if rec.is_file():
        dest = out_dir / "records.partial.parquet"
        os.replace(rec, dest)
        info["records"] = dest.name
        try:
            from servesweep.results.records import read_parquet

            info["rows"] = read_parquet(dest).num_rows
        except Exception as e:  # a torn file: kept, and said so
            info["unreadable"] = f"{type(e).__name__}: {e}"
    write_json_atomic(out_dir / "interrupted.json", info)
    shutil.rmtree(work, ignore_errors=True)
    return info


def failure_check(summary: dict, max_failure_rate: float | None) -> dict:
    """Whether a point's failures are above the threshold: none succeeded, or (with max_failure_rate) the failed
    share of measured requests is above it. {"pass", "message", "top_error", "max_failure_rate"}."""
    req = summary.get("requests") or {}
    measured, ok, failed = req.get("measured", 0), req.get("ok", 0), req.get("failed", 0)
    fails = summary.get("failures") or {}
    top = max(fails.items(), key=lambda kv: kv[1]) if fails else None
    top_txt = f"; top error class {top[0]} ({top[1]} of {measured})" if top else ""
    msg = None
    if ok == 0:
        msg = f"point {summary.get('point_id')}: 0 of {measured} measured requests succeeded{top_txt}"
    elif max_failure_rate is not None and measured and failed / measured > max_failure_rate:
        msg = (
            f"point {summary.get('point_id')}: {failed} of {measured} requests failed "
            f"({failed / measured:.1%} > max failure rate {max_failure_rate:.1%}){top_txt}"
        )
    return {
        "pass": msg is None,
        "message": msg,
        "top_error": top[0] if top else None,
        "max_failure_rate": max_failure_rate,
    }


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
        from servesweep.sim.launch import free_port

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


def run_point(
    point: LoadPoint,
    out_dir: Path,
    *,
    workers: int = 0,
    progress: Callable[[dict], None] | None = None,
    slos: str | None = None,
    command_prefix: list[str] | None = None,
    metrics_port: int | None = None,
    worker_hosts: dict | None = None,
    owned=None,
    max_failure_rate: float | None = None,
    probes: ProbeLog | None = None,
) -> dict:
    """Run ONE point as a headless Locust subprocess and write records.parquet, summary.json and locust.log into
    out_dir (atomically). Returns the summary dict. `progress` is called about once a second with
    {"point_id", "elapsed_s", "completed", "issued", "failed"}. `metrics_port`: the Locust process serves its live
    client metrics (servesweep.observe.exporter) on this port of 127.0.0.1 while the point runs.

    `workers=N`: N local worker processes (Locust --processes) share the users, the request budget and the
    arrival rate. `worker_hosts`: workers on the hosts of an Ansible inventory group instead, started over SSH by
    the locust_worker role ({"inventory": PATH_OR_TEXT, "group": "loadgen", "per_host": N, "master_host": ADDR,
    "master_port": 5557, "extravars": {...}, "package": WHEEL}); the master binds master_host. Either way a worker
    that dies mid-point is named in summary.json with the requests it lost, and the point is marked degraded.

    `owned` (manifest.OwnedProcesses): the Locust process group is recorded there (pid and start time) while it
    runs, so a resumed run can stop exactly it. An exception while Locust runs (Interrupted: a signal) stops the
    group (SIGTERM, SIGKILL after STOP_GRACE_S) and keeps the records Locust wrote as records.partial.parquet with
    interrupted.json (keep_partial) before it goes on up. `max_failure_rate`: summary["failure_check"] says
    whether the point's failures are above it (0 successes always are). `probes`: probe requests sent for this
    point before (counted into summary["probe_requests"] with this point's own).
    """
    from servesweep.results.records import read_parquet
    from servesweep.results.store import write_json_atomic
    from servesweep.results.summary import client_headroom, parse_slos, summarize

    if workers and worker_hosts:
        raise ValueError("workers and worker_hosts: give local worker processes or worker hosts, not both")
    remote = _check_worker_hosts(worker_hosts) if worker_hosts else None
    if workers and point.requests is not None and point.requests < workers:
        raise ValueError(
            f"requests={point.requests} < workers={workers}: every worker process needs a share of the budget"
        )
    parsed_slos = parse_slos(slos)  # fail on a bad SLO before any load
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    probes = probes if probes is not None else ProbeLog()
    point = resolve_point(point, probes)
    # build (and cache on disk) the pool here, so the child's start is quick and errors show early
    build_bodies(point)
    work = out_dir / ".work"
    work.mkdir(exist_ok=True)
    status_dir = work / "status"
    shutil.rmtree(status_dir, ignore_errors=True)
    status_dir.mkdir()
    for stale in ("records.parquet", "progress.json", "clients.json"):
        (work / stale).unlink(missing_ok=True)
    (work / "point.json").write_text(point.model_dump_json(indent=2))
    handle = None
    if remote is not None:
        from servesweep.driver.workers import master_command, start_remote_workers

        extravars = dict(remote["extravars"])
        if point.api_key_env and "locust_worker_api_key_env" not in extravars:
            extravars["locust_worker_api_key_env"] = point.api_key_env
        handle = start_remote_workers(
            remote["inventory"],
            remote["group"],
            remote["master_host"],
            remote["master_port"],
            remote["per_host"],
            work / "point.json",
            out_dir / "remote",
            package=remote["package"],
            extravars=extravars,
        )
        base = master_command(
            point,
            work,
            expect_workers=handle.expected,
            bind_host=remote["master_host"],
            bind_port=remote["master_port"],
        )
    else:
        base = locust_command(point, work, workers=workers)
    cmd = [*(command_prefix or []), *base]  # e.g. taskset -c 1
    if metrics_port:
        cmd += ["--metrics-port", str(metrics_port)]
    log_path = out_dir / "locust.log"
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if workers:
        env["SERVESWEEP_STATUS_DIR"] = str(status_dir)  # each worker process: its counters, 4 times a second
    try:
        cached_before = server_cached_tokens(point) if point.workload in ("shared_prefix", "agent") else None
        started = time.monotonic()
        with open(log_path, "wb") as log:
            ref = proc = None
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
                if owned is not None:
                    from servesweep.results.manifest import process_ref

                    ref = process_ref(proc.pid, "locust", group=True, point=point.id)
                    owned.add([ref])
                while proc.poll() is None:
                    time.sleep(0.5)
                    if progress is not None:
                        progress(_read_progress(work, point, time.monotonic() - started))
                if workers:
                    _wait_workers_gone(proc, status_dir)
            except BaseException as e:
                if proc is not None:
                    _kill_group(proc)
                    keep_partial(work, out_dir, point.id, f"{type(e).__name__}: {e}"[:500])
                raise
            finally:
                if owned is not None and ref is not None:
                    owned.remove([ref])
    finally:
        states = None
        if handle is not None:
            states = handle.stop()
    rc = proc.returncode
    rec_path = work / "records.parquet"
    if not rec_path.is_file():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise PointFailed(
            f"point {point.id}: Locust exited with {rc} and wrote no records; locust.log ends:\n{tail}"
        )
    table = read_parquet(rec_path)
    got = _read_json(work / "clients.json") or {}
    clients = got.get("clients", [])
    exits = {int(k): v for k, v in got.get("worker_exits", {}).items()}
    summary = {
        "point_id": point.id,
        "point": point.model_dump(mode="json"),
        "locust_exit_code": rc,
        "started_unix": t0,
        "wall_s": time.time() - t0,
        **summarize(table, slos=parsed_slos),
    }
    summary["client_headroom"] = client_headroom(clients, table, summary.get("itl_zero_gap_share"))
    summary["client_saturated"] = summary["client_headroom"]["client_saturated"]
    summary["degraded"], summary["problems"] = False, []
    summary["notes"] = list(probes.notes)
    summary["probe_requests"] = probes.as_dict()
    summary["failure_check"] = failure_check(summary, max_failure_rate)
    if workers or states is not None:
        from servesweep.driver.workers import account

        log_text = log_path.read_text(errors="replace")
        missing = {c.get("worker") for c in clients if c.get("missing")}
        if states is None:
            states = _local_worker_states(status_dir, exits)
        acc = account(states, table, log_text, missing=missing)
        summary["workers"] = acc
        summary["degraded"] = acc["degraded"]
        summary["problems"] = list(acc["problems"])
        expected = handle.expected if handle is not None else workers
        if len(states) < expected:
            summary["degraded"] = True
            summary["problems"].append(f"{len(states)} of {expected} worker processes reported")
    cached = None  # the server's cached tokens during the point
    if cached_before is not None and (after := server_cached_tokens(point)) is not None:
        cached = after - cached_before
    if point.workload == "shared_prefix":
        summary["shared_prefix"] = shared_prefix_check(point, summary, cached)
    elif cached_before is not None:
        summary["server_cached_tokens"] = cached
    os.replace(rec_path, out_dir / "records.parquet")
    for name in ("locust-report.html",):
        if (work / name).is_file():
            os.replace(work / name, out_dir / name)
    write_json_atomic(out_dir / "summary.json", summary)
    if progress is not None:
        progress(_read_progress(work, point, time.monotonic() - started))
    shutil.rmtree(work, ignore_errors=True)
    return summary


_CACHED_TOTAL = re.compile(r"^sglang:cached_tokens_total(?:\{[^}]*\})? (\S+)$", re.M)


def server_cached_tokens(point: LoadPoint) -> float | None:
    """SGLang's `sglang:cached_tokens_total` (summed over label sets) from GET /metrics; None when not exposed."""
    try:
        with _request(point, "/metrics", timeout=10) as r:
            text = r.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    got = [float(m[1]) for m in _CACHED_TOTAL.finditer(text)]
    return sum(got) if got else None


def shared_prefix_check(point: LoadPoint, summary: dict, server_cached: float | None) -> dict:
    """The shared-prefix target next to what was measured: every measured request but each group's first can be
    served the group's prefix (an upper bound: warmup requests raise it, evictions lower it). `server_cached`: the
    server's cached tokens during the point (None: not exposed)."""
    n = summary["requests"]["ok"]
    g = min(point.num_groups, n)
    target = (n - g) / n * point.shared_prefix_tokens / point.prompt_tokens if n else None
    return {
        "target_hit_ratio": target,
        "measured_hit_ratio": summary["cache_hit_ratio"],
        "server_cached_tokens": server_cached,
    }


def _read_progress(work: Path, point: LoadPoint, elapsed: float) -> dict:
    d = {"point_id": point.id, "elapsed_s": elapsed, "completed": 0, "issued": 0, "failed": 0}
    statuses = [_read_json(f) for f in sorted((work / "status").glob("*.json"))]
    if any(statuses):  # worker processes: the sum of their own counters
        for k in ("completed", "issued", "failed"):
            d[k] = sum(int(st.get(k, 0)) for st in statuses if st)
        return d
    got = _read_json(work / "progress.json")
    if isinstance(got, dict):
        d.update(got)
    return d


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _check_worker_hosts(wh: dict) -> dict:
    """worker_hosts with its defaults; a clear error naming the key that is wrong."""
    known = {"inventory", "group", "per_host", "master_host", "master_port", "extravars", "package"}
    bad = sorted(set(wh) - known)
    if bad:
        raise ValueError(f"worker_hosts: unknown keys {bad}; known: {sorted(known)}")
    for k in ("inventory", "master_host"):
        if not wh.get(k) or not isinstance(wh[k], str | Path):
            raise ValueError(f"worker_hosts.{k}: required (a string)")
    per_host = wh.get("per_host", 1)
    if not isinstance(per_host, int) or per_host < 1:
        raise ValueError(f"worker_hosts.per_host must be an integer >= 1, got {per_host!r}")
    port = wh.get("master_port", 5557)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"worker_hosts.master_port must be a TCP port, got {port!r}")
    extravars = wh.get("extravars") or {}
    if not isinstance(extravars, dict):
        raise ValueError("worker_hosts.extravars must be a mapping of role variables")
    inv = str(wh["inventory"])
    if "\n" not in inv and not Path(inv).is_file():
        raise ValueError(f"worker_hosts.inventory: {inv} is neither a file nor inventory text")
    return {
        "inventory": inv,
        "group": str(wh.get("group") or "loadgen"),
        "per_host": per_host,
        "master_host": str(wh["master_host"]),
        "master_port": port,
        "extravars": extravars,
        "package": Path(wh["package"]) if wh.get("package") else None,
    }


def _wait_workers_gone(proc: subprocess.Popen, status_dir: Path, timeout_s: float = 20.0) -> None:
    """Locust's master can exit before its forked workers have (its exit hook does not wait for a worker that is
    still running), and a worker writes that it quit at its very end: wait for them, bounded, then kill what is
    left of the process group (such a worker shows as one that did not quit)."""
    pids = []
    for f in status_dir.glob("*.json"):
        try:
            pids.append(int(f.stem))
        except ValueError:
            pass
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                stat = Path(f"/proc/{pid}/stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":
                    alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        pids = alive
        if pids:
            time.sleep(0.1)
    if pids:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _local_worker_states(status_dir: Path, exits: dict[int, int]):
    """The local worker processes as remote_workers.WorkerState, from their status files and exit statuses."""
    import socket

    from servesweep.driver.workers import WorkerState

    host = socket.gethostname()
    out = []
    statuses = [st for st in (_read_json(f) for f in status_dir.glob("*.json")) if st]
    for i, st in enumerate(sorted(statuses, key=lambda st: st["pid"])):
        pid = int(st["pid"])
        code = exits.get(pid, 0 if st.get("quit") else None)
        note = None
        if code is None:
            note = "stopped without quitting or an exit status"
        elif code > 128:
            note = f"was killed by signal {code - 128}"
        out.append(
            WorkerState(
                host="local",
                hostname=host,
                index=i,
                pid=pid,
                exit_code=code,
                stopped_by_role=False,
                status=st,
                log=None,
                note=note,
            )
        )
    return out


# ---------------------------------------------------------------- `servesweep load`

_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str, what: str) -> float:
    m = _DUR.match(text or "")
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 2m, 1.5h or 500ms", param_hint=what)
    v = float(m[1])
    return v * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, None: 1}[m[2]]


def parse_concurrency(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise click.BadParameter(
                f"{part!r} in {text!r} is not a positive integer", param_hint="--concurrency"
            )
        out.append(int(part))
    return out


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            v = float("nan")
        if not (v > 0 and math.isfinite(v)):
            raise click.BadParameter(
                f"{part.strip()!r} in {text!r} is not a positive number of requests per second",
                param_hint="--rate",
            )
        out.append(v)
    return out


def _fmt(v, spec=".1f") -> str:
    return "-" if v is None else format(v, spec)


def _p(summary: dict, metric: str, q: str) -> float | None:
    st = summary.get(metric)
    return None if st is None else st[q]


def results_table(summaries: list[dict], title: str = "servesweep load"):
    from rich.table import Table

    t = Table(title=title)
    open_loop = any(s["point"].get("arrival", "closed") != "closed" for s in summaries)
    if open_loop:
        for col in ("arrival", "rate /s", "got /s", "lag p50 ms", "lag p99 ms"):
            t.add_column(col, justify="right")
    for col in (
        "conc",
        "out tok/s",
        "req tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "ok",
        "failures",
        "prompt Δ%",
    ):
        t.add_column(col, justify="right")
    for s in summaries:
        fails = ", ".join(f"{k}={v}" for k, v in s["failures"].items()) or "0"
        dec = s.get("decode_tokens_per_s")
        lead = []
        if open_loop:
            pt, arr = s["point"], s.get("arrivals") or {}
            lead = [
                pt.get("arrival", "closed"),
                _fmt(pt.get("rate_rps"), "g"),
                _fmt(arr.get("rate_rps"), ".2f"),
                _fmt(_p(s, "schedule_lag_ms", "p50"), ".2f"),
                _fmt(_p(s, "schedule_lag_ms", "p99"), ".2f"),
            ]
        t.add_row(
            *lead,
            str(s["point"]["concurrency"]),
            _fmt(s["output_tokens_per_s"]),
            _fmt(dec["mean"] if dec else None),
            _fmt(_p(s, "ttft_ms", "p50")),
            _fmt(_p(s, "ttft_ms", "p99")),
            _fmt(_p(s, "itl_ms", "p50"), ".2f"),
            _fmt(_p(s, "itl_ms", "p99"), ".2f"),
            str(s["requests"]["ok"]),
            fails,
            _fmt(s["prompt_tokens"]["mean_deviation_pct"], "+.2f"),
        )
    return t


def _notes(summaries: list[dict]) -> list[str]:
    """Lines printed under the table: degraded points and a saturated load generator."""
    out = []
    for s in summaries:
        for n in s.get("notes") or ():
            out.append(f"[yellow]point {s['point_id']}: {n}[/]")
        for p in s.get("problems") or ():
            out.append(f"[red]point {s['point_id']} degraded: {p}[/]")
        if s.get("client_saturated"):
            why = "; ".join(s["client_headroom"]["reasons"])
            out.append(f"[yellow]point {s['point_id']}: the load generator saturated ({why})[/]")
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--base-url", default=None, help="server root (http://HOST:PORT); omitted: start the emulator")
@click.option("--model", default=None, help="model name; default: the first of /v1/models")
@click.option(
    "--endpoint", type=click.Choice(["chat", "completions", "generate"]), default="chat", show_default=True
)
@click.option(
    "--concurrency", "concurrency_text", default="8", show_default=True, help="N or a sweep: 1,2,4,8"
)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--output-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    default=None,
    help="measured requests per point (default without --duration: max(8, 2 x concurrency); open loop: 10 s of "
    "arrivals, max(8, 10 x rate))",
)
@click.option(
    "--arrival",
    type=click.Choice(["closed", "constant", "poisson"]),
    default="closed",
    show_default=True,
    help="closed loop, or open-loop arrivals at --rate (concurrency: the cap of streams in flight)",
)
@click.option("--rate", "rate_text", default=None, help="open loop: requests/s, or a sweep: 1,2,4")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Locust worker processes per point on this machine (0: one process)",
)
@click.option(
    "--worker-inventory",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="run the workers on the hosts of this Ansible inventory (the locust_worker role, over SSH)",
)
@click.option("--worker-group", default="loadgen", show_default=True, help="inventory group of worker hosts")
@click.option("--workers-per-host", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--master-host", default=None, help="address of this machine the worker hosts connect to")
@click.option("--master-port", type=click.IntRange(1, 65535), default=5557, show_default=True)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="file holding the API key (mode 0600); it reaches Locust through its environment only",
)
@click.option(
    "--duration", default=None, help="measured time per point (e.g. 60s); streams still running finish"
)
@click.option(
    "--warmup", default="0s", show_default=True, help="requests scheduled in this first time are warmup"
)
@click.option("--tokenizer", default=None, help="tokenizer.json, model dir, or qwen3.6 (default)")
@click.option("--no-cache-bust", is_flag=True, help="let requests share prefixes (no per-request nonce)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--api-key-env",
    default=None,
    help=f"NAME of the env var holding the API key (default {DEFAULT_KEY_ENV} if set)",
)
@click.option("--first-token-timeout", default="900s", show_default=True)
@click.option("--stall-timeout", default="120s", show_default=True)
@click.option(
    "--slo", default=None, help="e.g. 'ttft_p99<=2s,itl_p99<=50ms' or per request 'ttft<=2s' (goodput)"
)
@click.option(
    "--sim-args",
    default=DEFAULT_SIM_ARGS,
    show_default=True,
    help="emulator flags when --base-url is omitted (a --model-path is added when missing)",
)
@click.option(
    "--out",
    "out_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs"),
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="print the summaries as JSON instead of the table")
@click.option(
    "--no-ignore-eos", is_flag=True, help="leave ignore_eos out of the body (servers that reject it)"
)
@click.option(
    "--workload",
    type=click.Choice(["synthetic", "shared_prefix", "dataset", "agent"]),
    default="synthetic",
    show_default=True,
    help="what the requests are made of (docs/workloads.md)",
)
@click.option(
    "--output-dist", default=None, help="output lengths per prompt, e.g. lognormal:mean=512,sigma=0.5"
)
@click.option("--shared-prefix-tokens", type=click.IntRange(min=0), default=0, help="shared_prefix/agent")
@click.option("--num-groups", type=click.IntRange(min=1), default=1, show_default=True, help="shared_prefix")
@click.option("--dataset", default=None, help="dataset workload: a ShareGPT JSON or JSONL file")
@click.option("--dataset-min-tokens", type=click.IntRange(min=0), default=None)
@click.option("--dataset-max-tokens", type=click.IntRange(min=0), default=None)
@click.option("--thinking", type=click.Choice(["on", "off"]), default=None, help="chat_template_kwargs")
@click.option("--session-turns", type=click.IntRange(min=1), default=4, show_default=True, help="agent")
@click.option(
    "--tool-result-tokens", type=click.IntRange(min=0), default=500, show_default=True, help="agent"
)
@click.option("--think-time", default="0s", show_default=True, help="agent: pause between turns")
@click.option("--context-cap", type=click.IntRange(min=1), default=100_000, show_default=True, help="agent")
@click.option("--metrics-port", type=click.IntRange(min=0), default=0, help="serve live client metrics here")
@click.option(
    "--max-failure-rate",
    default=None,
    help="exit 3 when a point's failed share of measured requests is above this (0.05 or 5%); a point with 0 "
    "successes always does",
)
def command(max_failure_rate, **opts):
    """Run one load point or a sweep (concurrency and/or open-loop rate; one Locust run per point) and print the
    results table. Exit codes: docs/reports.md, "Exit codes"."""
    max_rate = parse_rate_limit(max_failure_rate, "--max-failure-rate")
    old_handlers = {}

    def on_signal(signum, frame):
        for sig in STOP_SIGNALS:  # once: a second signal must not break the stop that the first one began
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    for sig in STOP_SIGNALS:
        old_handlers[sig] = signal.signal(sig, on_signal)
    state: dict = {}
    try:
        _load(state, max_rate, **opts)
    except Interrupted as e:
        _interrupted(state, e)
    finally:
        for sig, h in old_handlers.items():
            signal.signal(sig, h)


def parse_rate_limit(text: str | None, what: str) -> float | None:
    """'5%' or '0.05' as a fraction in [0, 1]; None stays None."""
    if text is None:
        return None
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= 1:
        raise click.BadParameter(f"{text!r} is not a share between 0 and 1 (or 0% and 100%)", param_hint=what)
    return v


def _interrupted(state: dict, e: Interrupted) -> None:
    """A signal stopped `servesweep load`: Locust is stopped already (run_point); keep what finished, list the
    partial records of the point it interrupted, say so, exit 128 + signum."""
    from servesweep.results.store import write_manifest

    err = click.get_text_stream("stderr")
    name = signal.Signals(e.signum).name
    run_dir, manifest, current = state.get("run_dir"), state.get("manifest"), state.get("current")
    lines = [f"servesweep load: stopped by {name}; the load generator is stopped"]
    if run_dir is not None and manifest is not None:
        manifest["status"] = "interrupted"
        manifest["interrupted"] = {"signal": name, "unix": time.time(), "point": current}
        done = [p["point_id"] for p in manifest["points"]]
        if current is not None:
            info = _read_json(run_dir / current / "interrupted.json")
            if info is not None:
                manifest["points"].append(
                    {"point_id": current, "dir": current, "status": "interrupted", "partial": info}
                )
                if info.get("records"):
                    lines.append(
                        f"point {current} was interrupted: {info.get('rows')} finished requests in "
                        f"{run_dir / current / info['records']} (partial; see interrupted.json)"
                    )
        try:
            write_manifest(run_dir, manifest)
        except OSError:
            pass
        lines.append(f"finished points kept in {run_dir}: {', '.join(done) or 'none'}")
        left = [pid for pid in state.get("all_points", []) if pid not in done]
        if left:
            lines.append(f"not measured: {', '.join(left)} (run them again with servesweep load)")
    for line in lines:
        print(line, file=err, flush=True)
    sys.exit(128 + e.signum)


def _load(
    state: dict,
    max_rate: float | None,
    *,
    base_url,
    model,
    endpoint,
    concurrency_text,
    prompt_tokens,
    output_tokens,
    requests,
    arrival,
    rate_text,
    workers,
    worker_inventory,
    worker_group,
    workers_per_host,
    master_host,
    master_port,
    api_key_file,
    duration,
    warmup,
    tokenizer,
    no_cache_bust,
    seed,
    api_key_env,
    first_token_timeout,
    stall_timeout,
    slo,
    sim_args,
    out_root,
    as_json,
    no_ignore_eos,
    workload,
    output_dist,
    shared_prefix_tokens,
    num_groups,
    dataset,
    dataset_min_tokens,
    dataset_max_tokens,
    thinking,
    session_turns,
    tool_result_tokens,
    think_time,
    context_cap,
    metrics_port,
) -> None:
    """The body of `servesweep load`; `state` tells the signal path how far it got."""
    from contextlib import ExitStack

    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from servesweep.results.store import new_run, write_manifest
    from servesweep.results.summary import parse_slos

    err = Console(stderr=True)
    levels = parse_concurrency(concurrency_text)
    duration_s = parse_duration(duration, "--duration") if duration else None
    warmup_s = parse_duration(warmup, "--warmup")
    try:
        parse_slos(slo)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None
    if arrival == "closed" and rate_text is not None:
        raise click.BadParameter("a rate needs --arrival constant or poisson", param_hint="--rate")
    if arrival != "closed" and rate_text is None:
        raise click.BadParameter(f"--arrival {arrival} needs --rate (requests/s)", param_hint="--rate")
    rates: list[float | None] = parse_rates(rate_text) if rate_text is not None else [None]
    if workers and requests is not None and requests < workers:
        raise click.BadParameter(
            f"--requests {requests} < --workers {workers}: each worker process needs a share of the budget",
            param_hint="--workers",
        )
    worker_hosts = None
    if worker_inventory is not None:
        if workers:
            raise click.BadParameter("give --workers or --worker-inventory, not both", param_hint="--workers")
        if not master_host:
            raise click.BadParameter(
                "worker hosts need the address they reach this machine at", param_hint="--master-host"
            )
        worker_hosts = {
            "inventory": str(worker_inventory),
            "group": worker_group,
            "per_host": workers_per_host,
            "master_host": master_host,
            "master_port": master_port,
        }
    elif master_host:
        raise click.BadParameter("--master-host is for --worker-inventory", param_hint="--master-host")
    if api_key_file is not None:
        if api_key_env is not None:
            raise click.BadParameter(
                "give --api-key-file or --api-key-env, not both", param_hint="--api-key-file"
            )
        from servesweep.config.secrets import SecretError, read_key_file

        try:
            key = read_key_file(api_key_file)
        except SecretError as e:
            raise click.BadParameter(str(e), param_hint="--api-key-file") from None
        # The key lives in this process's environment and the Locust child's, never on a command line.
        api_key_env = FILE_KEY_ENV
        os.environ[FILE_KEY_ENV] = key
    if api_key_env is None and os.environ.get(DEFAULT_KEY_ENV):
        api_key_env = DEFAULT_KEY_ENV
    if api_key_env is not None and not os.environ.get(api_key_env):
        raise click.BadParameter(f"environment variable {api_key_env} is not set", param_hint="--api-key-env")

    with ExitStack() as stack:
        if base_url is None:
            from servesweep.sim.launch import start_sim

            args = shlex.split(sim_args)
            if not any(a.startswith(("--model-path", "--model")) for a in args):
                args = ["--model-path", DEFAULT_SIM_MODEL, *args]
            sim = stack.enter_context(start_sim(args))
            base_url = sim.base_url
            err.print(
                f"[bold]no --base-url: started the SGLang emulator at {base_url}[/] (servesweep sim {shlex.join(args)})"
            )
        points = []
        for c, rate in [(c, r) for c in levels for r in rates]:
            n = requests
            if n is None and duration_s is None:
                # closed loop: two requests per user; open loop: 10 s of arrivals at the rate
                n = max(8, 2 * c, workers) if rate is None else max(8, math.ceil(10 * rate), workers)
            pid = f"c{c}" if rate is None else f"c{c}-{arrival}{rate:g}"
            try:
                points.append(
                    LoadPoint(
                        base_url=base_url,
                        model=model,
                        endpoint=endpoint,
                        concurrency=c,
                        arrival=arrival,
                        rate_rps=rate,
                        prompt_tokens=prompt_tokens,
                        output_tokens=output_tokens,
                        requests=n,
                        duration_s=duration_s,
                        warmup_s=warmup_s,
                        tokenizer=tokenizer,
                        cache_bust=not no_cache_bust,
                        seed=seed,
                        api_key_env=api_key_env,
                        first_token_s=parse_duration(first_token_timeout, "--first-token-timeout"),
                        stall_s=parse_duration(stall_timeout, "--stall-timeout"),
                        point_id=pid,
                        ignore_eos=not no_ignore_eos,
                        workload=workload,
                        output_dist=output_dist,
                        shared_prefix_tokens=shared_prefix_tokens,
                        num_groups=num_groups,
                        dataset=dataset,
                        dataset_min_tokens=dataset_min_tokens,
                        dataset_max_tokens=dataset_max_tokens,
                        thinking={"on": True, "off": False}.get(thinking),
                        session_turns=session_turns,
                        tool_result_tokens=tool_result_tokens,
                        think_time_s=parse_duration(think_time, "--think-time"),
                        context_cap_tokens=context_cap,
                    )
                )
            except ValidationError as e:
                raise click.UsageError(str(e)) from None
        # Probe the server once for the whole run; every point reuses what it found.
        probes = ProbeLog()
        try:
            first = resolve_point(points[0], probes)
        except (RuntimeError, ValueError, OSError) as e:
            raise click.ClickException(f"probing {base_url}: {e}") from None
        for note in probes.notes:
            err.print(f"[yellow]warning: {note}[/]")
        run_id, run_dir = new_run(out_root)
        from servesweep.results.manifest import OwnedProcesses

        owned = OwnedProcesses(run_dir)  # processes.json: the Locust groups this run starts, while they run
        state.update(run_dir=run_dir, all_points=[p.id for p in points])
        fixed = {k: getattr(first, k) for k in ("model", "template_overhead", "continuous_usage")}
        points = [p.model_copy(update=fixed) for p in points]
        err.print(
            f"model {first.model}; chat template overhead {first.template_overhead} tokens; "
            f"per-chunk usage {'yes' if first.continuous_usage else 'no'}; results in {run_dir}"
        )
        manifest = {
            "run_id": run_id,
            "kind": "load",
            "base_url": base_url,
            "points": [],
            "argv": sys.argv[1:],
            "probe_requests": probes.as_dict(),
        }
        write_manifest(run_dir, manifest)
        state["manifest"] = manifest
        summaries = []
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=err,
            transient=False,
            disable=as_json and not err.is_terminal,
        ) as prog:
            for p in points:
                total = p.requests if p.duration_s is None else p.warmup_s + p.duration_s
                what = f"concurrency {p.concurrency}" + (f", {p.rate_rps:g}/s" if p.rate_rps else "")
                task = prog.add_task(what, total=total, status="")

                def _update(d, p=p, task=task):
                    done = (
                        d["completed"]
                        if p.duration_s is None
                        else min(d["elapsed_s"], p.warmup_s + p.duration_s)
                    )
                    prog.update(task, completed=done, status=f"{d['completed']} done, {d['failed']} failed")

                state["current"] = p.id
                # the run's probes are counted with its first point; their notes go with every point
                pl = probes if p is points[0] else ProbeLog()
                pl.notes = list(probes.notes)
                try:
                    s = run_point(
                        p,
                        run_dir / p.id,
                        workers=workers,
                        progress=_update,
                        slos=slo,
                        metrics_port=metrics_port or None,
                        worker_hosts=worker_hosts,
                        owned=owned,
                        max_failure_rate=max_rate,
                        probes=pl,
                    )
                except (RuntimeError, ValueError, OSError) as e:
                    raise click.ClickException(f"point {p.id}: {e}") from None
                summaries.append(s)
                manifest["points"].append(
                    {"point_id": p.id, "dir": p.id, "concurrency": p.concurrency, "rate_rps": p.rate_rps}
                )
                write_manifest(run_dir, manifest)
                state["current"] = None
        manifest["finished_unix"] = time.time()
        write_manifest(run_dir, manifest)

    if as_json:
        click.echo(json.dumps({"run_id": run_id, "run_dir": str(run_dir), "points": summaries}, indent=2))
    else:
        out = Console() if sys.stdout.isatty() else Console(width=150)
        out.print(
            results_table(
                summaries, title=f"servesweep load — {prompt_tokens} prompt / {output_tokens} output tokens"
            )
        )
        out.print(f"results: {run_dir}")
    for line in _notes(summaries):
        err.print(line)
    failed = [s["failure_check"]["message"] for s in summaries if not s["failure_check"]["pass"]]
    for msg in failed:
        err.print(f"[red]failed: {msg}[/]")
    slo_fail = [s for s in summaries if any(not c["pass"] for c in s.get("slos", []))]
    if slo_fail:
        err.print(f"[red]SLO breached at {', '.join(s['point_id'] for s in slo_fail)}[/]")
    if failed:
        sys.exit(3)  # docs/reports.md, "Exit codes": requests failed above the threshold
    if slo_fail:
        sys.exit(1)  # issue 8's exit codes: 0 pass, 1 breach, 2 could not run

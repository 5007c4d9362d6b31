"""A server that hangs (issue 35): from a moment in a point on it accepts connections and never answers anything,
/health included, and a restart hangs again. The point ends within its request timeouts (first_token_s, stall_s),
its requests are classified `timeout_*`, the point is marked failed with a reason that says the server hung (not
that it died: its process is still up), the restart is bounded by the role's startup timeout, the configuration's
remaining points are marked with the reason, and the matrix goes on with the next configuration. Nothing waits
forever: the run's whole time is bounded.

The server is the emulator behind a generic launcher: for the configuration with `--enable-metrics` the test hangs the
first server mid-point (`POST /sim/fault {"hang": true}`, the emulator's run-time control), and the wrapper starts
every later one with `--sim-hang-after 0` (ready, then hung at once: the role's readiness check never sees 200)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
from support import start_servesweep as start
from test_reliability_server import cleanup, manifest, run_dir_of, server_pid

from servesweep.sim.probe import http, post_json

WRAPPER = """\
#!/bin/sh
# argv = python model host port [flags...]; the --enable-metrics configuration gets extra flags from fault_flags
py="$1"; model="$2"; host="$3"; port="$4"; shift 4
extra=""
case " $* " in
  *" --enable-metrics "*)
    n=$(cat {tmp}/starts 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > {tmp}/starts
    extra=$(n="$n" port="$port" sh {tmp}/fault_flags) ;;
esac
exec "$py" -m servesweep.sim --model-path "$model" --host "$host" --port "$port" --sim-load-time 0.1 $extra "$@"
"""

# compressed in time: the point's request timeouts, the role's startup and stop timeouts, /health's per-try timeout
FIRST_TOKEN_S, STALL_S, STARTUP_S, STOP_S, HEALTH_S = 2, 2, 15, 5, 2


def faulty_experiment(tmp: Path, name: str, fault_flags: str, load: str, extra: str = "") -> Path:
    """A matrix of two configurations on the emulator behind a generic launcher: `--enable-metrics` (the faulty
    one: `fault_flags`, a shell snippet with $n, its start's number, and $port, prints its extra emulator flags) and
    without. `load`: the load section's keys, `extra`: more top-level keys."""
    wrapper = tmp / "server.sh"
    wrapper.write_text(WRAPPER.format(tmp=tmp))
    wrapper.chmod(0o755)
    (tmp / "fault_flags").write_text(fault_flags + "\n")
    launcher = {
        "python": sys.executable,
        "command": ["/bin/sh", str(wrapper), "{python}", "{model_path}", "{host}", "{port}"],
        "verify": False,
        "flush_cache_path": None,
        "workdir": str(tmp / "srv"),
        "startup_timeout_s": STARTUP_S,
        "stop_timeout_s": STOP_S,
        "health_timeout_s": HEALTH_S,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: {name}
            target: {{inventory: local, port: 0}}
            model: {{path: Qwen/Qwen3.6-27B, served_model_name: Qwen/Qwen3.6-27B}}
            answers: {{needle_probes: false}}
            launcher: {json.dumps(launcher)}
            server:
              base: {{context_length: 4096, max_running_requests: 8}}
              axes: {{enable_metrics: [true, false]}}
            load:
            """
        )
        + textwrap.indent(textwrap.dedent(load), "  ")
        + textwrap.dedent(extra)
    )
    return path


def first_point_running(
    proc: subprocess.Popen, runs: Path, within_s: float = 240
) -> tuple[Path | None, str | None]:
    """Poll the run's manifest until its first point runs: (run folder, point id); the point None when the run
    ended first or `within_s` passed."""
    run_dir = None
    deadline = time.monotonic() + within_s
    while proc.poll() is None and time.monotonic() < deadline:
        run_dir = run_dir or run_dir_of(runs)
        m = manifest(run_dir) if run_dir else None
        if m and m["points"][first := next(iter(m["points"]))]["status"] == "running":
            return run_dir, first
        time.sleep(0.1)
    return run_dir, None


def _metric(base: str, name: str) -> float:
    """sglang:`name` of the server at `base`, summed over its series."""
    text = http("GET", base + "/metrics", timeout=10)[2].decode()
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(f"sglang:{name}"))


def _port(srv: Path, pid: int) -> int:
    """The port of the live server `pid` (its pidfile's folder is p<port>)."""
    for f in srv.glob("p*/server.pid"):
        if f.read_text().strip() == str(pid):
            return int(f.parent.name[1:])
    raise AssertionError(f"no pidfile names {pid}")


def test_a_hung_server_ends_its_point_by_the_timeouts_and_the_matrix_goes_on(tmp_path):
    exp = faulty_experiment(
        tmp_path,
        "hang",
        # the first start serves (the test hangs it mid-point); every later one hangs as soon as it is ready
        'if [ "$n" -gt 1 ]; then echo --sim-hang-after 0; fi',
        f"""\
        concurrency: [1, 2]
        prompt_tokens: [64]
        output_tokens: [200]
        requests: 4
        first_token_s: {FIRST_TOKEN_S}
        stall_s: {STALL_S}
        total_s: 20
        """,
        "retries: 0\n",
    )
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    proc = start(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log")
    run_dir = None
    try:
        run_dir, first = first_point_running(proc, runs)
        assert first, (tmp_path / "run.log").read_text()[-3000:]
        pid = server_pid(srv)
        assert pid, "no live server pidfile while a point runs"
        base = f"http://127.0.0.1:{_port(srv, pid)}"
        # mid-stream: the point's first request done (its 200 tokens counted at its end; the probes before it
        # ask for 2 at most), the second one running, 0.3 s into its ~3 s
        until = time.monotonic() + 60
        while _metric(base, "generation_tokens_total") < 200 and time.monotonic() < until:
            time.sleep(0.05)
        while _metric(base, "num_running_reqs") < 1 and time.monotonic() < until:
            time.sleep(0.02)
        time.sleep(0.3)
        assert post_json(base + "/sim/fault", {"hang": True}, timeout=10)[0] == 200
        hung_at = time.monotonic()
        rc = proc.wait(timeout=400)
        after_hang = time.monotonic() - hung_at
        out = (tmp_path / "run.log").read_text()
        assert rc == 2, out[-3000:]  # points not measured (servesweep.exit_codes)
        m = manifest(run_dir)
        assert m["status"] == "finished", m["status"]
        bad_id, good_id = list(m["configs"])
        bad, good = m["configs"][bad_id], m["configs"][good_id]
        p1, p2 = (p for p in m["points"].values() if p["config_id"] == bad_id)
        # the point: failed, and it says the server hung (its process was up), not that it died
        assert p1["status"] == "failed" and p1["server_lost"] == "the server hung", p1
        assert p1["reason"].startswith("the server hung during this point"), p1["reason"]
        assert "answered nothing" in p1["reason"], p1["reason"]
        # its requests ended by the timeouts, each classified: the one streaming stalled, the rest got no first token
        aside = run_dir / p1["records_aside"]
        s = json.loads((aside / "summary.json").read_text())
        assert set(s["failures"]) <= {"timeout_stall", "timeout_first_token"}, s["failures"]
        assert s["requests"]["failed"] == sum(s["failures"].values()) >= 3, s["requests"]
        assert s["requests"]["ok"] + s["requests"]["failed"] == 4
        classes = pq.read_table(aside / "records.parquet", columns=["error_class"]).column(0).to_pylist()
        assert sorted(c for c in classes if c) == sorted(
            k for k, v in s["failures"].items() for _ in range(v)
        )
        # within its timeouts: the first request done, the streaming one stalled, the 2 after it got no first token
        assert s["requests"]["ok"] == 1, s["requests"]
        assert s["failures"] == {"timeout_stall": 1, "timeout_first_token": 2}, s["failures"]
        recs = pq.read_table(aside / "records.parquet").to_pylist()
        for r in recs[1:]:
            last = r["chunk_ns"][-1] if r["chunk_ns"] else r["sent_ns"]
            limit = STALL_S if r["error_class"] == "timeout_stall" else FIRST_TOKEN_S
            assert limit <= (r["end_ns"] - last) / 1e9 < limit + 0.5, r
        assert s["window_s"] < 4 * max(FIRST_TOKEN_S, STALL_S) + 3, s["window_s"]
        assert (aside / "server.log").is_file() and "hanging now" in (aside / "server.log").read_text()
        # the configuration: the crash says what happened, the restart hung too (bounded by the startup timeout),
        # so it failed and its other point is marked with the reason; no result folder for either point
        assert [(c["point"], c["what"]) for c in bad["crashes"]] == [(first, "the server hung")]
        assert bad["status"] == "failed" and bad["restarts"] == 1, bad
        assert f"/health did not answer 200 within {STARTUP_S} s" in bad["error"], bad["error"][:500]
        assert p2["status"] == "server_failed", p2
        assert p2["reason"].startswith("server did not start: ") and bad["error"] in p2["reason"]
        assert not any((run_dir / pid).exists() for pid, p in m["points"].items() if p["config_id"] == bad_id)
        # the matrix went on: the next configuration measured both its points cleanly
        assert good["status"] == "done"
        for pid, p in m["points"].items():
            if p["config_id"] == good_id:
                sg = json.loads((run_dir / pid / "summary.json").read_text())
                assert p["status"] == "done" and sg["requests"]["ok"] == 4 and sg["requests"]["failed"] == 0
        assert "the server hung during " in " ".join(out.split()), out[-3000:]
        assert server_pid(srv) is None, "the hung server was left running"
        # bounded: the point's timeouts + /health's 3 tries of HEALTH_S + 1 + 2 s + the log + the stop (5 s) + the restart's
        # startup timeout (15 s) + the next configuration (~40 s on this machine); before issue 35 the hung
        # /health alone took 2 x 93 s
        assert after_hang < 170, f"{after_hang:.0f} s from the hang to the run's end"
        print(
            f"\nhang: point {s['wall_s']:.1f} s, failures {s['failures']}, ok {s['requests']['ok']}; "
            f"restart hung (bounded {STARTUP_S} s); next configuration done; {after_hang:.0f} s from the hang to "
            "the run's end"
        )
    finally:
        cleanup(proc, run_dir, srv)

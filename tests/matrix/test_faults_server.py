"""A server that crash-loops (issue 35): it dies under a point, and from then on every start exits at once with the
same error (a GPU left in a bad state: `RuntimeError: CUDA error: ...`). servesweep restarts it a bounded number of
times (the point's `retries`), then marks the configuration failed with that decisive log line and its remaining
points `server_failed` with the reason, and the matrix goes on with the next configuration, whose points are
measured cleanly. Nothing waits forever: the run's whole time is bounded.

The server is the emulator behind a generic launcher (launcher.command): a wrapper script that, for the configuration
with `--enable-metrics`, serves on its first start and exits 1 with a CUDA traceback on every later one; the test
SIGKILLs the first server by the pid the role recorded (never a command-line match)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from support import start_servesweep as start
from test_reliability_server import cleanup, manifest, run_dir_of, server_pid

WRAPPER = """\
#!/bin/sh
# crash-loop stand-in: argv = python model host port [flags...]
py="$1"; model="$2"; host="$3"; port="$4"; shift 4
n=$(cat {count} 2>/dev/null || echo 0)
case " $* " in
  *" --enable-metrics "*)
    n=$((n + 1)); echo "$n" > {count}
    if [ "$n" -gt 1 ]; then
      echo "Traceback (most recent call last):"
      echo '  File "/srv/server.py", line 12, in <module>'
      echo "RuntimeError: CUDA error: an illegal memory access was encountered"
      exit 1
    fi ;;
esac
exec "$py" -m servesweep.sim --model-path "$model" --host "$host" --port "$port" --sim-load-time 0.1 "$@"
"""


def _experiment(tmp: Path) -> Path:
    wrapper = tmp / "crashloop.sh"
    wrapper.write_text(WRAPPER.format(count=tmp / "bad-starts"))
    wrapper.chmod(0o755)
    cmd = json.dumps(["/bin/sh", str(wrapper), "{python}", "{model_path}", "{host}", "{port}"])
    path = tmp / "crashloop.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: crashloop
            target: {{inventory: local, port: 0}}
            model: {{path: Qwen/Qwen3.6-27B, served_model_name: my-model}}
            launcher:
              python: {sys.executable}
              command: {cmd}
              verify: false
              flush_cache_path: null
              workdir: {tmp / "srv"}
              startup_timeout_s: 60
              stop_timeout_s: 20
            server:
              base: {{context_length: 4096, max_running_requests: 8}}
              axes: {{enable_metrics: [true, false]}}
            load:
              concurrency: [1, 2]
              prompt_tokens: [64]
              output_tokens: [160]
              requests: 3
            retries: 1
            """
        )
    )
    return path


def test_a_crash_looping_server_is_retried_a_bounded_number_of_times_then_the_matrix_goes_on(tmp_path):
    exp = _experiment(tmp_path)
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    t0 = time.monotonic()
    proc = start(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log")
    run_dir = None
    killed = None
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline and killed is None:
            run_dir = run_dir or run_dir_of(runs)
            m = manifest(run_dir) if run_dir else None
            if m:
                first = next(iter(m["points"]))
                if m["points"][first]["status"] == "running":
                    time.sleep(1.0)  # inside the point: 3 requests of 160 tokens, one at a time
                    killed = server_pid(srv)
                    assert killed, "no live server pidfile while a point runs"
                    os.killpg(killed, signal.SIGKILL)
            time.sleep(0.1)
        assert killed, (tmp_path / "run.log").read_text()[-3000:]
        rc = proc.wait(timeout=400)
        took = time.monotonic() - t0
        out = (tmp_path / "run.log").read_text()
        assert rc == 2, out[-3000:]  # points not measured: could not run (servesweep.exit_codes)
        m = manifest(run_dir)
        assert m["status"] == "finished", m["status"]
        bad_id, good_id = list(m["configs"])
        bad, good = m["configs"][bad_id], m["configs"][good_id]
        decisive = "RuntimeError: CUDA error: an illegal memory access was encountered"
        # bounded: one good start, one restart that crashed at once; no further tries
        assert (tmp_path / "bad-starts").read_text().strip() == "2"
        assert bad["status"] == "failed" and bad["restarts"] == 1, bad
        assert bad["error"].startswith(decisive), bad["error"][:300]
        assert [c["point"] for c in bad["crashes"]] == [first]
        bad_points = {k: v for k, v in m["points"].items() if v["config_id"] == bad_id}
        assert len(bad_points) == 2
        for pid, p in bad_points.items():
            assert p["status"] == "server_failed", (pid, p)
            assert p["reason"].startswith(f"server did not start: {decisive}"), p["reason"][:300]
            assert not (run_dir / pid).exists(), "no result folder for a point that was not measured"
        # the crashed attempt's records and the server's log are kept aside
        assert (run_dir / "crashed" / f"{first}.1" / "server.log").is_file()
        # the matrix went on: the next configuration measured both its points cleanly
        assert good["status"] == "done"
        for pid, p in m["points"].items():
            if p["config_id"] == good_id:
                s = json.loads((run_dir / pid / "summary.json").read_text())
                assert p["status"] == "done" and s["requests"]["ok"] == 3 and s["requests"]["failed"] == 0
        assert decisive in " ".join(out.split()), out[-3000:]
        assert server_pid(srv) is None
        print(f"\ncrash loop: 1 kill, 1 restart that crashed, 2 points server_failed; the next configuration "
              f"done; run {took:.0f} s")  # fmt: skip
    finally:
        cleanup(proc, run_dir, srv)

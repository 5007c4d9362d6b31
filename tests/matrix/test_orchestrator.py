"""`servesweep run` end to end on localhost (the role starts the emulator; real Locust per point): killed with
SIGKILL mid-matrix and resumed, it loses nothing and repeats nothing; a configuration that cannot start is recorded
with its log and the run goes on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
from support import SERVESWEEP, emulator_experiment_head, start_servesweep


def _experiment(tmp: Path) -> Path:
    f = tmp / "exp.yaml"
    f.write_text(
        # no_such_flag: a forked build's flag (launcher.extra_flags), so it passes plan and the server rejects it
        emulator_experiment_head(tmp, "killtest").replace(
            "  emulator: true\n", "  emulator: true\n  extra_flags: [no_such_flag]\n", 1
        )
        + textwrap.dedent(
            """\
              bundles:
                - name: good
                - name: broken
                  flags: {no_such_flag: 1}
                - name: mtp
                  flags: {speculative_algorithm: NEXTN, speculative_num_steps: 2}
            exclude:
              - {bundle: mtp, concurrency: 2}
            load:
              concurrency: [1, 2]
              prompt_tokens: [160]
              output_tokens: 4
              requests: 2
            flush_cache_between_points: true
            """
        )
    )
    return f


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=30)


def _cleanup(run_dir: Path | None, srv: Path) -> None:
    """Whatever a failed test left: load generators naming the run folder, the emulator from its pidfile."""
    if run_dir is not None:
        needle = str(run_dir.resolve())
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(needle in a for a in (p.info["cmdline"] or [])):
                    p.kill()
            except psutil.NoSuchProcess:
                continue
    for pidfile in srv.glob("*/server.pid"):
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_sigkill_mid_matrix_then_resume_loses_and_repeats_nothing(tmp_path):
    exp = _experiment(tmp_path)
    runs = tmp_path / "runs"
    run_dir = None
    first = start_servesweep(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "first.log")
    try:
        # wait until the first point is done and the second is running, then kill the orchestrator outright
        deadline = time.monotonic() + 180
        killed_while = None
        while time.monotonic() < deadline:
            dirs = list(runs.glob("killtest-*")) if runs.exists() else []
            if dirs and (dirs[0] / "manifest.json").exists():
                run_dir = dirs[0]
                st = [p["status"] for p in _manifest(run_dir)["points"].values()]
                if st.count("done") == 1 and "running" in st:
                    killed_while = st
                    os.kill(first.pid, signal.SIGKILL)  # only the orchestrator: its children are orphaned
                    break
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.2)
        assert killed_while, (
            "the run never reached its second point: " + (tmp_path / "first.log").read_text()[-3000:]
        )
        first.wait(timeout=30)
        before = _manifest(run_dir)
        done_before = {pid for pid, p in before["points"].items() if p["status"] == "done"}
        assert len(done_before) == 1
        (done_id,) = done_before
        summary_before = (run_dir / done_id / "summary.json").read_bytes()
        records_mtime = (run_dir / done_id / "records.parquet").stat().st_mtime_ns

        # the manifest as servesweep wrote it before issue 29: a done point with a copy of its summary's headline
        # (`result`); the copy is read and dropped, the figures come from summary.json
        old = json.loads((run_dir / "manifest.json").read_text())
        old["points"][done_id]["result"] = {"ok": 2, "failed": 0, "ttft_p50_ms": 0.5, "degraded": True}
        (run_dir / "manifest.json").write_text(json.dumps(old, indent=2))
        second = start_servesweep(["run", "--resume", str(run_dir)], tmp_path, tmp_path / "second.log")
        try:
            rc = second.wait(timeout=300)
        finally:
            if second.poll() is None:
                _kill_group(second)
        out = (tmp_path / "second.log").read_text()
        assert rc == 2, out[-3000:]  # could not run: the broken configuration's points are not measured
        m = _manifest(run_dir)
        assert m["resumed"] and m["status"] == "finished"
        pts = m["points"]
        good = {
            k: v for k, v in pts.items() if ".broken." not in k and not k.split(".")[0].endswith("broken")
        }
        broken = {k: v for k, v in pts.items() if k not in good}
        assert len(good) == 3 and len(broken) == 2
        # nothing lost: every good point is done, with its records (2 measured requests each) and summary
        for pid, p in good.items():
            assert p["status"] == "done", (pid, p)
            d = run_dir / pid
            s = json.loads((d / "summary.json").read_text())
            assert s["point_id"] == pid and s["requests"]["ok"] == 2 and s["requests"]["failed"] == 0
            assert pq.read_table(d / "records.parquet").num_rows == 2
            assert "result" not in p  # its figures are its summary.json's alone
            if pid != done_id:  # measured by this process: its console line reads the summary
                line = f"✓ {pid}: {s['output_tokens_per_s']:.1f} tok/s, TTFT p50 {s['ttft_ms']['p50']:.1f}ms,"
                assert line in " ".join(out.split()), out[-3000:]
            assert p["cache_flushed"] is True  # POST /flush_cache answered 200 before the point
        # nothing repeated: the point finished before the kill was neither rerun nor rewritten
        assert pts[done_id]["attempts"] == 1
        assert (run_dir / done_id / "summary.json").read_bytes() == summary_before
        assert (run_dir / done_id / "records.parquet").stat().st_mtime_ns == records_mtime
        interrupted = [k for k, v in before["points"].items() if v["status"] == "running"]
        assert len(interrupted) == 1 and pts[interrupted[0]]["attempts"] == 2
        assert not list(run_dir.glob(".tmp-*"))
        # the configuration that cannot start: recorded with its log, and the run went on to the next
        cfg = next(c for cid, c in m["configs"].items() if cid.endswith("broken"))
        assert cfg["status"] == "failed" and "exited before /health" in cfg["error"]
        # the decisive line first (the server's argparse error), then the role's message with the log's tail
        decisive = "servesweep sim: error: unrecognized arguments: --no-such-flag 1"
        assert cfg["error"].startswith(decisive + " -- "), cfg["error"][:300]
        assert decisive in " ".join(out.split()), out[-3000:]
        log = Path(cfg["log"])
        assert log.is_file() and "unrecognized arguments: --no-such-flag 1" in log.read_text()
        assert all(
            p["status"] == "server_failed" and p["reason"].startswith(f"server did not start: {decisive}")
            for p in broken.values()
        )
        # resolved server info per configuration, versions, git revision, host facts
        mtp = next(c for cid, c in m["configs"].items() if cid.endswith("mtp"))
        assert mtp["server"]["server_info"]["speculative_algorithm"] == "EAGLE"  # NEXTN is reported as EAGLE
        assert m["versions"]["ansible-core"] and m["versions"]["locust"]
        # the host's facts, read by the readiness probe on the host (this machine: no GPU, so no nvidia-smi lines)
        facts = m["hosts"]["localhost"]
        assert facts["hostname"] == socket.gethostname().split(".")[0] and facts["kernel"] == os.uname().release
        assert facts["cpus"] == os.cpu_count() and facts["memtotal_mb"] == psutil.virtual_memory().total >> 20
        assert facts["os"] and facts["gpus"] == []
        assert m["git_rev"]
        # the results table and where the results are; the old copy's `degraded` was not read
        assert "results:" in out and str(run_dir) in out and "DEGRADED" not in out
        assert (
            f"report: {run_dir / 'report.html'}" in out.replace("\n", "")
            and (run_dir / "report.md").is_file()
        )
        # the server was stopped at the end, and no load generator of the run is left
        assert _port_free(m["port"])
        assert not [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(str(run_dir) in a for a in (p.info["cmdline"] or []))
        ]
    finally:
        if first.poll() is None:
            _kill_group(first)
        _cleanup(run_dir, tmp_path / "srv")


def test_run_refuses_a_bad_experiment_with_its_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(_experiment(tmp_path).read_text().replace("output_tokens: 4", "output_tokens: four"))
    r = subprocess.run(
        SERVESWEEP + ["run", str(f), "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    line = 1 + next(i for i, t in enumerate(f.read_text().splitlines()) if "output_tokens: four" in t)
    assert f"bad.yaml:{line}: load.output_tokens: expected a list of integers, got 'four'" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_workloads_axis_runs_end_to_end_and_the_exporter_serves_each_point(tmp_path):
    """single + agent + shared_prefix as one axis, on the emulator: each point's summary shows its workload, and the
    run's client metrics (Prometheus) list every finished point while the run's exporter is up."""
    import io
    import urllib.request

    from rich.console import Console

    from servesweep.config.experiment import load_experiment
    from servesweep.matrix.orchestrator import Runner
    from servesweep.matrix.run_setup import create_run

    f = tmp_path / "wl.yaml"
    f.write_text(
        emulator_experiment_head(tmp_path, "wltest")
        + textwrap.dedent(
            """\
            load:
              concurrency: 1
              prompt_tokens: 300
              output_tokens: 4
              requests: 2
              workload: [single, agent, prefix]
              workloads:
                agent: {session_turns: 2, tool_result_tokens: 20, context_cap_tokens: 2000}
                prefix: {workload: shared_prefix, shared_prefix_tokens: 200, num_groups: 1}
            flush_cache_between_points: false
            """
        )
    )
    exp = load_experiment(f)
    m = create_run(exp, tmp_path / "runs", experiment_file=str(f))
    out = io.StringIO()
    runner = Runner(m, console=Console(file=out, width=200))
    try:
        rc = runner.run()
        assert rc == 0, out.getvalue()[-3000:]
        man = _manifest(m.run_dir)
        pts = man["points"]
        assert sorted(pts) == [
            "s01.agent-chat-p300-o4-c1",
            "s01.prefix-chat-p300-o4-c1",
            "s01.single-chat-p300-o4-c1",
        ]
        summaries = {pid: json.loads((m.run_dir / pid / "summary.json").read_text()) for pid in pts}
        for pid, s in summaries.items():
            assert pts[pid]["status"] == "done" and s["requests"]["ok"] >= 2, (pid, s["requests"])
        agent = summaries["s01.agent-chat-p300-o4-c1"]
        assert agent["point"]["workload"] == "agent" and agent["sessions"]["sessions"] >= 1
        prefix = summaries["s01.prefix-chat-p300-o4-c1"]
        assert prefix["point"]["workload"] == "shared_prefix" and prefix["shared_prefix"]
        single = summaries["s01.single-chat-p300-o4-c1"]
        assert single["point"]["workload"] == "synthetic" and not single.get("sessions")
        # the exporter: announced, recorded in the manifest, listed in the Prometheus targets with the server
        ex = man["exporter"]
        assert f"http://127.0.0.1:{ex['port']}/metrics" in out.getvalue()
        sd = m.run_dir.parent / ".observe" / "targets"  # the observe stack's one targets folder
        targets = json.loads((sd / f"servesweep-{m.data['run_id']}-exporter.json").read_text())
        assert targets[0]["targets"] == [f"127.0.0.1:{ex['port']}"]
        sglang = json.loads((sd / f"sglang-{m.data['run_id']}-server.json").read_text())
        assert sglang[0]["targets"] == [f"127.0.0.1:{man['port']}"] and sglang[0]["labels"]["config"] == "s01"
        with urllib.request.urlopen(ex["url"], timeout=10) as r:
            text = r.read().decode()
        info = [ln for ln in text.splitlines() if ln.startswith("servesweep_point_info{")]
        assert {pid for pid in pts if any(f'point_id="{pid}"' in ln for ln in info)} == set(pts), info
        # records were observed once each (no double counting): TTFT histogram counts = ok requests
        for pid, s in summaries.items():
            count = [
                ln
                for ln in text.splitlines()
                if ln.startswith("servesweep_ttft_seconds_count{") and f'point_id="{pid}"' in ln
            ]
            assert count and float(count[0].rsplit(" ", 1)[1]) == s["requests"]["ok"], (pid, count)
    finally:
        runner.close()
        _cleanup(m.run_dir, tmp_path / "srv")


def test_open_loop_rates_are_an_axis_of_the_matrix(tmp_path):
    """load.arrival poisson with load.rate as an axis: the point ids carry r<rate>, an exclusion rule may name the
    rate, each point is scheduled at its rate (the summary's achieved rate follows the asked one), and
    load.workers / load.worker_hosts together are refused with the line."""
    import io

    from rich.console import Console

    from servesweep.config.experiment import ExperimentError, load_experiment, parse_experiment
    from servesweep.matrix.orchestrator import Runner
    from servesweep.matrix.run_setup import create_run

    f = tmp_path / "open.yaml"
    f.write_text(
        emulator_experiment_head(tmp_path, "openloop", load_time=0.1)
        + textwrap.dedent(
            """\
            exclude:
              - {rate: 2, concurrency: 1}
            load:
              arrival: poisson
              rate: [2, 10]
              concurrency: [1, 4]
              prompt_tokens: 64
              output_tokens: 4
              requests: 8
            flush_cache_between_points: false
            """
        )
    )
    exp = load_experiment(f)
    m = create_run(exp, tmp_path / "runs", experiment_file=str(f))
    assert sorted(m.points) == ["s01.chat-p64-o4-c1-r10", "s01.chat-p64-o4-c4-r10", "s01.chat-p64-o4-c4-r2"]
    out = io.StringIO()
    runner = Runner(m, console=Console(file=out, width=200))
    try:
        rc = runner.run()
        assert rc == 0, out.getvalue()[-3000:]
        pts = _manifest(m.run_dir)["points"]
        got = {}
        for pid, p in pts.items():
            s = json.loads((m.run_dir / pid / "summary.json").read_text())
            assert p["status"] == "done" and s["requests"]["ok"] == 8, (pid, s["requests"])
            assert s["point"]["arrival"] == "poisson" and s["point"]["rate_rps"] == p["rate"]
            got[pid] = s["arrivals"]["rate_rps"]
        # 8 Poisson arrivals are noisy: the asked rates are 5x apart, the achieved ones at least 2x
        assert got["s01.chat-p64-o4-c4-r10"] > 2 * got["s01.chat-p64-o4-c4-r2"], got
    finally:
        runner.close()
        _cleanup(m.run_dir, tmp_path / "srv")
    bad = f.read_text().replace(
        "  requests: 8\n",
        "  requests: 8\n  workers: 2\n  worker_hosts: {inventory: inv.ini, master_host: 10.0.0.1}\n",
    )
    try:
        parse_experiment(bad, "open.yaml")
    except ExperimentError as e:
        assert "load.workers (local processes) and load.worker_hosts: give one of them" in str(e)
    else:
        raise AssertionError("workers and worker_hosts together were accepted")

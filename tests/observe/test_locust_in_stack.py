"""Locust runs and `servesweep load` reach Grafana with no glue (issue 34 item 2), on real parts: one standing stack
(`servesweep observe up`, the Debian Prometheus, 1 s scrapes) and one emulator for the whole file, real Locust
processes started from a folder whose `runs/.observe` is that stack (as a user who ran `observe up` there).

What a user checks, and what was broken before:
- a headless `locust -f locustfiles/llm.py` is a target of the stack's Prometheus while it runs (there were 0
  targets), its series are queryable, the Matrix dashboard's query shows its point (the summary gauges were never
  set), and its target file is gone when it exits;
- `observe backfill` takes that run's `--records r.parquet`, as `report` and `gate` do (it said "not a servesweep run
  folder"), and the exporter pushes it to a real Pushgateway (for a Prometheus that did not watch the run);
- a master with worker processes is one target, and its summary counts every worker's records (the last ones
  arrive after the stop);
- a web UI Locust registers too, its summary gauges appear after the test stops, and after a SIGKILL its file is
  removed by the next `observe targets` (stale targets do not pile up);
- `servesweep load` with no option sets the `servesweep_point_*` gauges of its run in Prometheus (Matrix and History
  were empty until a backfill).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from support import SERVESWEEP

from servesweep.net import free_port
from servesweep.observe import stack
from servesweep.observe.dashboards import matrix
from servesweep.observe.dashboards.queries import summ, with_axes
from servesweep.observe.promconfig import start_pushgateway
from servesweep.sim.launch import start_sim

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = str(ROOT / "locustfiles" / "llm.py")
SIM = ["--model-path", "Qwen/Qwen3.6-27B", "--context-length", "2048", "--sim-load-time", "0"]
SMALL = ["--prompt-tokens", "100", "--output-tokens", "16"]
SECRET = "sk-servesweep-test-secret-0042"  # an API key: it must reach no target file, label or log


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != stack.ENV_DIR}
    return {**env, "PYTHONUNBUFFERED": "1", "SS_TEST_KEY": SECRET, "OPENAI_API_KEY": SECRET}


def _texts(folder: Path) -> list[str]:
    """The target files there now (read while a process runs: they are gone after it)."""
    out = []
    for p in folder.glob("*.json"):
        try:
            out.append(p.read_text())
        except FileNotFoundError:
            pass
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A results root `runs` under a working folder, its stack up, and the emulator."""
    cwd = tmp_path_factory.mktemp("lab")
    port = free_port()
    up = subprocess.run([*SERVESWEEP, "observe", "up", "--root", str(cwd / "runs"), "--port", str(port),
                         "--scrape-interval", "1s", "--no-grafana"],
                        capture_output=True, text=True, timeout=60, env=_env())  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    sim = start_sim(SIM, log_path=cwd / "sim.log")
    try:
        yield {
            "cwd": cwd,
            "prom": f"http://127.0.0.1:{port}",
            "sim": sim,
            "targets": cwd / "runs/.observe/targets",
        }
    finally:
        sim.stop()
        stack.down(cwd / "runs")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _query(prom: str, expr: str) -> list[dict]:
    return _get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")["data"]["result"]


def _locust_targets(prom: str) -> list[dict]:
    """Prometheus' own view: the active targets whose run_id is a hand-started Locust's."""
    active = _get(f"{prom}/api/v1/targets?state=active")["data"]["activeTargets"]
    return [t for t in active if t["labels"].get("run_id", "").startswith("locust-")]


def _after_earlier_locusts(prom: str) -> None:
    """Until Prometheus has dropped the targets of the Locust processes of earlier tests (their files are gone; file
    discovery takes a few seconds to notice): a test's one up target is then its own process. Their run ids can be
    the same (a run id is the start's UTC second) and their instances too (a port used again)."""
    _until(lambda: not _locust_targets(prom), 30, "the earlier tests' Locust targets gone from Prometheus")


def _until(
    cond: Callable, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None
):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None and not cond()):
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise AssertionError(f"{what}: not within {timeout:.0f}s\n{tail}")
        time.sleep(0.3)


def _matrix_rows(prom: str, run_id: str) -> list[dict]:
    """The Matrix dashboard's "Points of the run" query for one column (TTFT p99), as Grafana sends it."""
    _title, metric, stat, _unit = next(c for c in matrix.COLUMNS if c[0] == "TTFT p99")
    expr = with_axes(summ(metric, matrix.SEL, stat), matrix.SEL)
    expr = expr.replace("$run_id", run_id).replace("$model", ".*").replace("$config", ".*")
    return _query(prom, expr.replace("$__range", "15m"))


def _locust(world, log: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--host", world["sim"].base_url, *SMALL, *args]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, cwd=world["cwd"], stdout=out, stderr=subprocess.STDOUT, env=_env(),
                                start_new_session=True)  # fmt: skip


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_headless_locust_is_scraped_summarized_unregistered_and_backfillable(world):
    prom, log = world["prom"], world["cwd"] / "headless.log"
    records = world["cwd"] / "r.parquet"
    proc = _locust(world, log, "--headless", "-u", "2", "-r", "2", "-t", "6s", "--records", str(records),
                   "--api-key-env", "SS_TEST_KEY")  # fmt: skip
    try:
        (target,) = _until(lambda: [t for t in _locust_targets(prom) if t["health"] == "up"], 30,
                           "the headless Locust as an up target", proc, log)  # fmt: skip
        run_id = target["labels"]["run_id"]
        assert "__servesweep_owner" not in target["labels"]  # the owner stamp never reaches a series
        files = _texts(world["targets"])
        assert files and not any(SECRET in t for t in files) and SECRET not in json.dumps(target)
        _until(lambda: _query(prom, f'servesweep_ttft_seconds_count{{run_id="{run_id}"}} > 0'), 30,
               "its TTFT histogram queryable", proc, log)  # fmt: skip
        # the Live dashboard's run picker (label_values(servesweep_point_info, run_id)) lists it
        assert _query(prom, f'servesweep_point_info{{run_id="{run_id}", concurrency="2"}}')
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        _kill(proc)
    out = log.read_text()
    assert "waiting up to" in out and "did not scrape" not in out, out[-2000:]
    assert SECRET not in out
    # the summary set at the stop was scraped before the process went: the Matrix dashboard shows the point
    (row,) = _matrix_rows(prom, run_id)
    assert float(row["value"][1]) > 0 and row["metric"]["concurrency"] == "2", row
    assert not list(world["targets"].glob("servesweep-locust-*.json")), "its target file outlived it"

    bf = subprocess.run([*SERVESWEEP, "observe", "backfill", "--root", str(world["cwd"] / "runs"), str(records)],
                        capture_output=True, text=True, timeout=120, env=_env())  # fmt: skip
    assert bf.returncode == 0 and "block(s)" in bf.stdout, bf.stdout + bf.stderr
    om = subprocess.run([*SERVESWEEP, "prom", "backfill", str(records), "--out",
                         str(world["cwd"] / "unused"), "--openmetrics"],
                        capture_output=True, text=True, timeout=60, env=_env())  # fmt: skip
    assert om.returncode == 0, om.stderr
    assert 'servesweep_point_ttft_seconds{run_id="r-' in om.stdout and 'stat="p99"' in om.stdout
    # with a Prometheus that did not watch it (the compose stack's): push the records' summary to a Pushgateway
    pg_port = free_port()
    with start_pushgateway(world["cwd"] / "pushgateway", port=pg_port) as pg:
        push = subprocess.run([sys.executable, str(ROOT / "exporters" / "exporter.py"), "push", str(records), "--gateway",
                               pg.url], capture_output=True, text=True, timeout=60, env=_env())  # fmt: skip
        assert push.returncode == 0, push.stdout + push.stderr
        with urllib.request.urlopen(f"{pg.url}/metrics", timeout=5) as r:
            pushed = r.read().decode()
    assert "servesweep_point_requests{" in pushed and 'run_id="r-' in pushed, pushed[-2000:]


def test_a_master_with_worker_processes_registers_once_and_its_summary_counts_every_workers_records(world):
    """Workers ship their last records after the stop: the master's summary is made again once they are in."""
    import pyarrow.parquet as pq

    prom, log, records = world["prom"], world["cwd"] / "master.log", world["cwd"] / "m.parquet"
    _after_earlier_locusts(prom)
    proc = _locust(world, log, "--headless", "--processes", "2", "-u", "2", "-r", "2", "-t", "4s",
                   "--records", str(records))  # fmt: skip
    try:
        (target,) = _until(lambda: [t for t in _locust_targets(prom) if t["health"] == "up"], 30,
                           "the master as the one up target", proc, log)  # fmt: skip
        assert proc.wait(90) == 0, log.read_text()[-3000:]
    finally:
        _kill(proc)
    run_id = target["labels"]["run_id"]
    measured = pq.read_table(records, columns=["warmup"]).column("warmup").to_pylist().count(False)
    got = _query(prom, f'last_over_time(servesweep_point_requests{{run_id="{run_id}"}}[15m])')
    assert measured > 0 and [float(s["value"][1]) for s in got] == [measured], (got, measured)
    assert not list(world["targets"].glob("servesweep-locust-*.json"))


def test_web_ui_locust_registers_shows_its_summary_and_a_sigkill_leaves_no_stale_target(world):
    prom, log = world["prom"], world["cwd"] / "webui.log"
    _after_earlier_locusts(prom)
    proc = _locust(world, log, "--web-host", "127.0.0.1", "--web-port", str(free_port()), "--autostart",
                   "-u", "2", "-r", "2", "-t", "4s")  # fmt: skip
    try:
        (target,) = _until(lambda: [t for t in _locust_targets(prom) if t["health"] == "up"], 30,
                           "the web UI Locust as an up target", proc, log)  # fmt: skip
        run_id = target["labels"]["run_id"]
        # the test stops after 4 s and the UI stays: its summary gauges are scraped from the live process
        _until(lambda: _query(prom, f'servesweep_point_requests{{run_id="{run_id}"}} > 0'), 40,
               "the point's summary gauges", proc, log)  # fmt: skip
        files = list(world["targets"].glob("servesweep-locust-*.json"))
        assert len(files) == 1 and proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)  # nothing of the process runs at exit
        proc.wait(10)
        assert files[0].exists()
        listed = subprocess.run([*SERVESWEEP, "observe", "targets", "--root", str(world["cwd"] / "runs")],
                                capture_output=True, text=True, timeout=30, env=_env())  # fmt: skip
        assert listed.returncode == 0 and "locust-" not in listed.stdout, listed.stdout
        assert not files[0].exists(), "a killed Locust's target file stayed"
    finally:
        _kill(proc)


def test_servesweep_load_sets_the_point_summary_gauges_matrix_reads(world):
    log, runs = world["cwd"] / "load.log", world["cwd"] / "runs"
    # credentials in the URL and a key in the environment: neither may reach a target file or the log
    url = world["sim"].base_url.replace("http://", "http://user:pw-secret@")
    with open(log, "wb") as out:
        proc = subprocess.Popen([*SERVESWEEP, "load", "--base-url", url, "--concurrency", "2", "--requests", "8",
                                 *SMALL, "--out", str(runs)],
                                cwd=world["cwd"], stdout=out, stderr=subprocess.STDOUT, env=_env())  # fmt: skip
    files: list[str] = []
    try:
        while proc.poll() is None:
            files += [t for t in _texts(world["targets"]) if '"load-' in t]
            time.sleep(0.2)
    finally:
        _kill(proc)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert files and not any(SECRET in t or "pw-secret" in t for t in files), files
    assert SECRET not in out
    run_id = next(json.loads(m.read_text())["run_id"] for m in runs.glob("load-*/manifest.json"))
    (row,) = _matrix_rows(world["prom"], run_id)
    assert float(row["value"][1]) > 0, row
    # the exporter is gone (its series are stale now): what Matrix and History read is the last value in range
    got = _query(world["prom"], f'last_over_time(servesweep_point_requests{{run_id="{run_id}"}}[15m])')
    assert [s["value"][1] for s in got] == ["8"], (got, out[-2000:])
    assert not list(world["targets"].glob(f"*{run_id}*.json")), "the load run's target files outlived it"

"""A degraded point (issue 35): one Locust worker SIGKILLed mid-point, by the pid it recorded in its status file,
under `servesweep load --workers 2` and `servesweep run` with `load.workers: 2`. Before, the point's summary.json
said `degraded: true` and the console printed a line, but the table row looked clean (20 ok, 0 failures, of 40
asked), the report did not mention it, and `servesweep gate` passed it (exit 0). Here every surface a user reads
is checked as the user reads it: the load table's row, `run`'s exit code and table, the gate's exit code and
line, the report in Chromium (a banner with what happened and the concurrency held, the row's badge), and
`compare`'s summary line. The two run folders are made once for the module (one emulator, two points)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from test_compare import servesweep
from test_report import CHROMIUM_ARGS

from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"
POINT = ["--concurrency", "4", "--requests", "40", "--prompt-tokens", "64", "--output-tokens", "64"]


def _kill_one_worker(root: Path, status_glob: str, killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the first of the point's two Locust workers once both have sent requests: its pid is the name of
    the status file it writes (never a match on command lines)."""
    while not stop.is_set():
        for status in root.glob(status_glob):
            files = sorted(status.glob("*.json"))
            if len(files) == 2 and all('"issued": 0,' not in f.read_text() for f in files):
                time.sleep(0.5)  # its streams in flight, their records not shipped yet
                pid = int(files[0].stem)
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.05)


def _run_killing_a_worker(
    args: list[str], root: Path, status_glob: str
) -> tuple[subprocess.CompletedProcess, int]:
    """`servesweep ARGS` to its end while one worker of its point is killed; (the process, the killed pid)."""
    killed: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=_kill_one_worker, args=(root, status_glob, killed, stop), daemon=True)
    t.start()
    try:
        r = servesweep(*args, timeout=180)
    finally:
        stop.set()
        t.join(5)
    assert killed, f"the killer found the two workers:\n{r.stdout}\n{r.stderr}"
    return r, killed[0]


def _experiment(path: Path, base_url: str) -> Path:
    path.write_text(
        textwrap.dedent(
            f"""\
            name: degraded
            sglang_version: "0.5.23"
            target: {{base_url: {base_url}}}
            model: {{path: {MODEL}}}
            launcher: {{emulator: true, gpu: H200}}
            server: {{base: {{context_length: 2048}}}}
            load:
              workload: chat
              concurrency: [4]
              prompt_tokens: [64]
              output_tokens: 64
              requests: 40
              workers: 2
            flush_cache_between_points: false
            answers: {{needle_probes: false}}
            slo: ["ttft_p99<=30s"]
            """
        )
    )
    return path


@pytest.fixture(scope="module")
def degraded(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("degraded")
    with start_sim(
        ["--model-path", MODEL, "--sim-calibration", "speedup=4"], log_path=root / "sim.log"
    ) as sim:
        load, load_pid = _run_killing_a_worker(
            ["load", "--base-url", sim.base_url, "--workers", "2", *POINT, "--out", root / "load-runs"],
            root / "load-runs",
            "*/c4/.work/status",
        )
        exp = _experiment(root / "degraded.yaml", sim.base_url)
        run, run_pid = _run_killing_a_worker(
            ["run", exp, "--out", root / "run-runs"], root / "run-runs", "*/.tmp-*/.work/status"
        )
    ((load_dir,), (run_dir,)) = (list((root / d).iterdir()) for d in ("load-runs", "run-runs"))
    return {"load": load, "load_dir": load_dir, "load_pid": load_pid, "run": run, "run_dir": run_dir,
            "run_pid": run_pid}  # fmt: skip


def test_the_points_are_degraded(degraded):
    s = json.loads((degraded["load_dir"] / "c4" / "summary.json").read_text())
    assert s["degraded"] and f":{degraded['load_pid']} on local" in s["problems"][0], s["problems"]
    assert s["point"]["concurrency"] == 4 and s["in_flight"]["mean"] < 3.5, s["in_flight"]
    (point,) = json.loads((degraded["run_dir"] / "manifest.json").read_text())["points"].values()
    assert point["status"] == "done", point
    # the point's figures are its summary.json's (the manifest keeps no copy of them: issue 29)
    assert json.loads((degraded["run_dir"] / point["dir"] / "summary.json").read_text())["degraded"] is True


def test_load_table_row_and_line_say_degraded(degraded):
    r = degraded["load"]
    s = json.loads((degraded["load_dir"] / "c4" / "summary.json").read_text())
    held = s["in_flight"]["mean"]
    (row,) = [line for line in r.stdout.splitlines() if line.startswith(f"│ 4→{held:.1f} ")]
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[9] == f"lost={s['workers']['lost_requests']}", row  # never shown as 0 failures
    caption = " ".join(r.stdout[r.stdout.index(row) :].split())
    assert "DEGRADED: c4 ran at a lower load than asked (conc: asked→held;" in caption, r.stdout
    text = " ".join(r.stderr.split())
    assert "point c4 DEGRADED (its figures are not the asked load): worker" in text, r.stderr
    assert f"concurrency 4 asked, {held:.1f} held (mean requests in flight in the records)" in text, r.stderr


def test_load_exits_2_for_a_degraded_point(degraded):
    r = degraded["load"]
    assert r.returncode == 2, r.stderr
    assert "exit 2: 1 point(s) DEGRADED" in " ".join(r.stderr.split())


def test_run_exits_2_and_its_table_says_degraded(degraded):
    r = degraded["run"]
    text = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2, text[-3000:]
    assert "exit 2: 1 point(s) DEGRADED, measured at a lower load than asked (s01.chat-p64-o64-c4)" in text
    assert "! DEGRADED s01.chat-p64-o64-c4: " in text, text  # the point's line, no tick
    assert "DEGRADED (its figures are not the asked load): worker" in text, text
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("│ s01 ")]
    assert row.split("│")[6].strip() == "DEGRADED", row  # the status column of the results table


def cli(command, *args) -> tuple[int, str]:
    """A results command in this process (CliRunner: its exit code and output as the CLI gives them; these
    commands start nothing, and a child process would cost a second of imports each)."""
    from click.testing import CliRunner

    r = CliRunner().invoke(command, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    return r.exit_code, r.stdout


def test_gate_fails_a_degraded_point_with_2_unless_allowed(degraded, tmp_path):
    from servesweep.cli.gate import command as gate

    d = degraded["load_dir"]
    code, out = cli(gate, d, "--slo", "ttft_p99<=30s", "--junit", tmp_path / "gate.xml")
    assert code == 2, out
    assert out.startswith(f"DEGRADED {d.name}: 1 point(s) measured at a lower load than asked"), out
    assert "c4 degraded: worker" in out and "exited with 137" in out
    junit = (tmp_path / "gate.xml").read_text()
    assert 'name="not degraded"' in junit and 'type="degraded"' in junit
    # an SLO breach besides: still 2 (the one that says least was measured wins), the breach said too
    code, out = cli(gate, d, "--slo", "ttft_p99<=0.001ms")
    assert code == 2 and "besides, 1 of 2 checks failed" in out, out
    code, out = cli(gate, d, "--slo", "ttft_p99<=30s", "--allow-degraded")
    assert code == 0 and "(1 degraded point(s) allowed: c4)" in out, out
    code, out = cli(gate, degraded["run_dir"])  # the experiment's own slo
    assert code == 2 and out.startswith("DEGRADED "), out


def test_compare_marks_the_degraded_points(degraded):
    from servesweep.cli.compare import command as compare

    code, out = cli(compare, degraded["load_dir"], degraded["run_dir"], "--compact", "--resamples", 100)
    first = " ".join(out.split("\n\n")[0].split())  # the summary line, however the console wrapped it
    assert code == 0 and "1 point(s) DEGRADED, measured at a lower load than asked" in first, out
    assert "chat p64 o64 c4 DEGRADED (baseline, run)" in first, out
    code, out = cli(compare, degraded["load_dir"], degraded["run_dir"], "--json", "--resamples", 100)
    (rc,) = json.loads(out)
    assert rc["points"][0]["degraded"] == ["baseline", "run"]


def test_report_says_it_in_a_banner_and_the_row(degraded):
    from playwright.sync_api import sync_playwright

    from servesweep.cli.report import command as report

    d = degraded["load_dir"]
    code, out = cli(report, d)
    assert code == 0 and f"html: {d / 'report.html'}" in out, out
    held = json.loads((d / "c4" / "summary.json").read_text())["in_flight"]["mean"]
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": 1400, "height": 900})
            page.goto((d / "report.html").as_uri())
            banner = page.locator("#degraded-banner")
            assert banner.is_visible()
            box = banner.bounding_box()
            assert box is not None and box["y"] < 200, box  # at the head of the page, above the tables
            text = " ".join(banner.inner_text().split())
            assert "1 point(s) DEGRADED" in text and "exited with 137" in text, text
            assert f"concurrency 4 asked, {held:.1f} held" in text, text
            row = page.locator('table.points tr[data-point="c4"]')
            assert row.get_attribute("data-degraded") == "true"
            badge = row.locator('span.badge[data-flag="DEGRADED"]')
            assert badge.is_visible() and "exited with 137" in (badge.get_attribute("title") or "")
            conc = " ".join(row.locator('td[data-key="concurrency"]').inner_text().split())
            assert conc == f"4→{held:.1f}", conc
            assert page.locator("dl.flag-legend dt", has_text="DEGRADED").count() == 1
        finally:
            b.close()
    md = (d / "report.md").read_text()
    assert "> **1 point(s) DEGRADED**" in md and "> - **c4**: worker" in md


@pytest.mark.fast
def test_in_flight_weighs_each_level_by_the_time_it_held():
    import numpy as np

    from servesweep.results.degraded import in_flight

    # 4 in flight for 1 s, then 2 for 3 s (two users gone): mean (4 × 1 + 2 × 3) / 4 = 2.5, median 2, max 4
    got = in_flight(np.array([0, 0, 0, 0]) * 1e9, np.array([1, 1, 4, 4]) * 1e9)
    assert got == {"mean": 2.5, "p50": 2.0, "max": 4.0}
    # one user, back to back: an end and the next start at one instant are not two in flight
    assert in_flight(np.array([0.0, 1e9]), np.array([1e9, 2e9])) == {"mean": 1.0, "p50": 1.0, "max": 1.0}
    assert in_flight(np.array([]), np.array([])) is None


@pytest.mark.fast
def test_the_load_after_the_lost_workers_last_record():
    """A long point: 4 users (2 per worker) for 40 s, worker b's last record ends at 40 s, then 2 users to 60 s.
    The mean over the point (3.3) understates the loss; from b's last record on, 2 were held."""
    import numpy as np

    from servesweep.results.degraded import Degradation, Timeline

    starts = np.arange(0, 60, 10.0)
    sent = np.concatenate([starts, starts, starts[:4], starts[:4]]) * 1e9
    end = sent + 10e9
    worker = np.array(["a:1"] * 12 + ["b:2"] * 8, dtype=object)
    at, after = Timeline(sent, end, worker).after_loss(["b:2"])
    assert at == 40.0 and after == {"mean": 2.0, "p50": 2.0, "max": 2.0}
    # a worker none of whose records reached the master: lost from the start, the whole span is "after"
    at, after = Timeline(sent[:12], end[:12], worker[:12]).after_loss(["b:2"])
    assert at == 0.0 and after is not None and after["mean"] == 2.0
    d = Degradation(
        "c4", ["worker b:2 ... exited with 137: 3 of its 11 requests lost"], 3, 4, 3.3, None, None, 40.0, 2.0
    )
    assert d.load_text == (
        "concurrency 4 asked, 3.3 held (mean requests in flight in the records), 2.0 from 40.0 s on "
        "(the lost worker's last record)"
    )


@pytest.mark.fast
def test_an_open_loop_point_says_its_rate():
    """An open-loop point has no concurrency to hold: its asked rate against the measured requests per second."""
    from servesweep.results.degraded import degradation

    summary = {
        "point_id": "c8-poisson40",
        "degraded": True,
        "problems": ["worker w:7 on local (#1) exited with 137: 9 of its 31 requests lost"],
        "point": {"concurrency": 8, "arrival": "poisson", "rate_rps": 40.0},
        "requests": {"measured": 120},
        "window_s": 5.0,
        "in_flight": {"mean": 3.1, "p50": 3.0, "max": 8.0},
    }
    d = degradation(summary)
    assert d is not None and d.short == "40→24.0/s"
    assert d.line() == (
        "point c8-poisson40 DEGRADED (its figures are not the asked load): worker w:7 on local (#1) exited with "
        "137: 9 of its 31 requests lost; rate 40/s asked, 24.0/s got"
    )
    assert degradation({**summary, "degraded": False}) is None and degradation(None) is None

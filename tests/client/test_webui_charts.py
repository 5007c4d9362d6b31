"""The charts of servesweep's Locust web UI, in a real browser (Debian Chromium via Playwright), with screenshots.

One real Locust process with the web UI (local runner) against the emulator. A step ramp is chosen in the start
form: the users field says the ramp drives the users and is read-only. While the ramp runs, the "LLM charts" button
opens the charts over the UI: the time series of TTFT p50/p99, ITL p99 (per chunk and per token), output tok/s and streams in flight are
SVG paths with several points each. After the ramp, the per-step charts have one point per step with concurrency
on the x axis (integer ticks) and the step table under them. Locust's Aggregated row counts the real requests only
(the `LLM TTFT`/`LLM E2E` rows are not requests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from servesweep.net import free_port
from servesweep.sim.launch import start_sim

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip
STEPS, HOLD_S = (2, 4), 6

pytestmark = pytest.mark.timeout(180)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _wait_state(ui: str, want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _get_json(ui + "/stats/requests")["state"] != want:
        assert time.monotonic() < deadline, f"not {want} within {timeout}s"
        time.sleep(0.3)


def _paths(frame, chart: str) -> dict[str, int]:
    """Series name -> number of points of that chart's SVG paths."""
    got = frame.locator(f"#c-{chart} path").evaluate_all(
        "ps => ps.map(p => [p.dataset.series, +p.dataset.points, p.getAttribute('d').split(/[ML]/).length - 1])"
    )
    for _name, n, in_d in got:
        assert n == in_d  # the path really has that many vertices
    return {name: n for name, n, _ in got}


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("charts")
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"],
                   log_path=tmp / "sim.log") as sim:  # fmt: skip
        port = free_port()
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "llm.py"), "--host", sim.base_url,
               "--web-host", "127.0.0.1", "--web-port", str(port), "--prompt-tokens", "300", "--output-tokens",
               "24", "--stop-timeout", "3"]  # fmt: skip
        log = tmp / "locust.log"
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                start_new_session=True)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    _get_json(url + "/stats/requests")
                    break
                except OSError:
                    assert time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.3)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)


def test_the_web_ui_draws_live_and_per_step_charts(ui):
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(20_000)
            page.goto(ui + "/")
            page.get_by_text("Custom parameters").click()
            users = page.locator("input[name=userCount]")
            expect(users).to_be_editable()
            page.select_option("select[name=loadShape]", "step-ramp")
            expect(users).not_to_be_editable()  # the ramp drives the users: the field says so
            expect(page.get_by_text("Number of users: set by the step ramp")).to_be_visible()
            page.fill("input[name=rampSteps]", ",".join(map(str, STEPS)))
            page.fill("input[name=rampHold]", str(HOLD_S))
            page.screenshot(path=str(ARTIFACTS / "webui-charts-form.png"))
            page.get_by_role("button", name="Start").click()
            _wait_state(ui, "running", 20)

            page.locator("#servesweep-charts-button").click()
            frame = page.frame_locator("#servesweep-charts-panel iframe")
            # into the second step (its users run), then until each live series has 3 points (sampled every 2 s)
            deadline = time.monotonic() + HOLD_S + 20
            while _get_json(ui + "/stats/requests")["user_count"] != STEPS[1]:
                assert time.monotonic() < deadline, "the ramp never reached its second step"
                time.sleep(0.3)
            expect(frame.locator("#c-ttft path").first).to_be_attached()

            def enough(live):
                return (
                    live["ttft"].get("p50", 0) >= 3
                    and live["ttft"].get("p99", 0) >= 3
                    and live["itl"].get("p99 per chunk", 0) >= 3
                    and live["itl"].get("p99 per token", 0) >= 3
                    and live["tps"].get("output tok/s (last 10 s)", 0) >= 3
                    and live["flight"].get("streams in flight", 0) >= 3
                )

            while not enough(live := {c: _paths(frame, c) for c in ("ttft", "itl", "tps", "flight")}):
                assert time.monotonic() < deadline, live
                time.sleep(0.5)
            page.screenshot(path=str(ARTIFACTS / "webui-charts-live.png"))

            _wait_state(ui, "stopped", 40)  # the shape ends the test after its last step
            expect(frame.locator("#steps tbody tr")).to_have_count(len(STEPS), timeout=15_000)
            steps = {c: _paths(frame, c) for c in ("sttft", "sitl", "stps")}
            assert steps == {"sttft": {"p50": 2, "p99": 2}, "sitl": {"p99 per chunk": 2}, "stps": {"output tok/s": 2}}
            xticks = frame.locator("#c-sttft text.xtick").evaluate_all("ts => ts.map(t => t.textContent)")
            assert all(t.isdigit() for t in xticks) and {"2", "4"} <= set(xticks), xticks  # integer concurrency
            concs = frame.locator("#steps tbody tr td:nth-child(2)").all_inner_texts()
            assert [int(c) for c in concs] == list(STEPS)
            page.screenshot(path=str(ARTIFACTS / "webui-charts-steps.png"))
            # the screenshot shows the charts: the panel covers most of the page
            box = page.locator("#servesweep-charts-panel").bounding_box()
            assert box["width"] > 1000 and box["height"] > 800
        finally:
            browser.close()

    # Locust's Aggregated row: the real requests only (the LLM rows are measurements of those requests)
    stats = _get_json(ui + "/stats/requests")["stats"]
    rows = {(r["method"], r["name"]): r for r in stats}
    post = next(r for (m, _n), r in rows.items() if m == "POST")
    agg = next(r for r in stats if r["name"] == "Aggregated")
    assert post["num_requests"] > 10 and agg["num_requests"] == post["num_requests"], stats
    assert rows[("LLM", "TTFT")]["num_requests"] == post["num_requests"] - post["num_failures"]

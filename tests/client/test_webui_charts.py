"""The charts of servesweep's Locust web UI, in a real browser (Debian Chromium via Playwright), with screenshots.

One real Locust process with the web UI (local runner) against the emulator, several tests in one UI session.
First a manual test of 2 users with long streams, stopped while both stream (Locust kills them: --stop-timeout 0);
then a step ramp 1,2 with the same options: its "streams in flight" are its own users' streams only (none carried
over from the killed ones), and when its second step opens (no request of it finished yet: "-" cells) the per-step
charts still draw the first step's point inside the plot. Then a step ramp is chosen in the start
form: the users field says the ramp drives the users and is read-only. While the ramp runs, the "LLM charts" button
opens the charts over the UI: the time series of TTFT p50/p99, ITL p99 (per chunk and per token), output tok/s and streams in flight are
SVG paths with several points each. After the ramp, the per-step charts have one point per step with concurrency
on the x axis (integer ticks) and the step table under them. Locust's Aggregated row counts the real requests only
(the `LLM TTFT`/`LLM E2E` rows are not requests).
"""

from __future__ import annotations

import json
import os
import re
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

# assertions wait as long as actions (Playwright's 5 s default is an idle machine's): slow, never wrong
expect.set_options(timeout=30_000)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip
STEPS, HOLD_S = (2, 4), 6
LONG_OUTPUT = 1000  # tokens: a stream of ~3.7 s on the emulator at speedup=4
L, R, T, B, W, H = 56, 12, 10, 30, 600, 220  # charts.js's plot margins and viewBox

pytestmark = pytest.mark.timeout(300)  # a 2-core machine under the whole suite (five workers)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def _wait_state(ui: str, want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _get_json(ui + "/stats/requests")["state"] != want:
        assert time.monotonic() < deadline, f"not {want} within {timeout}s"
        time.sleep(0.3)


def _vertices(frame, chart: str) -> dict[str, list[tuple[float, float]]]:
    """Series name -> the (x, y) vertices of that chart's SVG path, in the chart's viewBox."""
    got = frame.locator(f"#c-{chart} path").evaluate_all(
        "ps => ps.map(p => [p.dataset.series, p.getAttribute('d')])"
    )
    return {name: [tuple(map(float, v.split())) for v in re.split(r"[ML]", d)[1:]] for name, d in got}


def _in_plot(x: float, y: float) -> bool:
    return L - 0.5 <= x <= W - R + 0.5 and T - 0.5 <= y <= H - B + 0.5


def _samples(ui: str) -> list[dict]:
    return _get_json(ui + "/servesweep/series.json")["samples"]


def _open_form(page, ui: str) -> None:
    page.goto(ui + "/")
    new = page.get_by_role("button", name="New")
    if _get_json(ui + "/stats/requests")["state"] == "stopped":
        new.click()
    page.get_by_text("Custom parameters").click()


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
               "24", "--stop-timeout", "0"]  # fmt: skip
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


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def test_streams_in_flight_are_each_tests_own_and_an_open_step_keeps_the_step_charts(ui, browser, tmp_path):
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(60_000)  # a 2-core machine under the whole suite: slow, never wrong
    # 1. two users streaming long answers, stopped mid-stream: Locust kills both streams
    _open_form(page, ui)
    page.fill("input[name=userCount]", "2")
    page.fill("input[name=spawnRate]", "2")
    page.fill("input[name=outputTokens]", str(LONG_OUTPUT))
    page.get_by_role("button", name="Start").click()
    deadline = time.monotonic() + 30
    while not any(x["in_flight"] == 2 for x in _samples(ui)):
        assert time.monotonic() < deadline, _samples(ui)
        time.sleep(0.3)
    page.get_by_role("button", name="Stop").click()
    _wait_state(ui, "stopped", 20)

    # 2. a step ramp 1,2 with the same LLM options (the process keeps its context)
    _open_form(page, ui)
    page.select_option("select[name=loadShape]", "step-ramp")
    page.fill("input[name=rampSteps]", "1,2")
    page.fill("input[name=rampHold]", "9")
    assert page.locator("input[name=outputTokens]").input_value() == str(LONG_OUTPUT)
    page.get_by_role("button", name="Start").click()
    _wait_state(ui, "running", 20)
    page.locator("#servesweep-charts-button").click()
    frame = page.frame_locator("#servesweep-charts-panel iframe")

    def open_step_has_no_data() -> bool:
        steps = _get_json(ui + "/servesweep/live.json")["steps"]
        return len(steps) == 2 and steps[0]["TTFT p50 ms"] != "-" and steps[1]["TTFT p50 ms"] == "-"

    deadline = time.monotonic() + 40
    while not open_step_has_no_data():
        assert time.monotonic() < deadline, _get_json(ui + "/servesweep/live.json")["steps"]
        time.sleep(0.3)
    # the charts page has drawn the open step (its table row) while the step still has "-" cells
    expect(frame.locator("#steps tbody tr")).to_have_count(2, timeout=30_000)
    drawn = _vertices(frame, "sttft")
    assert open_step_has_no_data(), "the second step had data before the chart was checked"
    page.screenshot(path=str(tmp_path / "open-step.png"))
    assert [len(v) for v in drawn.values()] == [1, 1], drawn  # p50 and p99 of the first step
    assert all(_in_plot(*v) for pts in drawn.values() for v in pts), drawn

    # streams in flight: this test's users' streams, at every sample (the killed ones are not open)
    deadline = time.monotonic() + 15
    while not any(x["users"] == 2 and x["in_flight"] == 2 for x in _samples(ui)):
        assert time.monotonic() < deadline, _samples(ui)
        time.sleep(0.5)
    samples = _samples(ui)
    assert all(x["in_flight"] <= x["users"] for x in samples), samples
    assert any(x["users"] == 1 and x["in_flight"] == 1 for x in samples), samples
    page.screenshot(path=str(tmp_path / "in-flight.png"))
    page.get_by_role("button", name="Stop").click()
    _wait_state(ui, "stopped", 20)
    page.context.close()


def test_the_web_ui_draws_live_and_per_step_charts(ui, browser, tmp_path):
    try:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.set_default_timeout(60_000)  # a 2-core machine under the whole suite: slow, never wrong
        _open_form(page, ui)
        page.fill("input[name=outputTokens]", "24")
        page.select_option("select[name=loadShape]", "manual")  # the last test's step-ramp is kept
        users = page.locator("input[name=userCount]")
        expect(users).to_be_editable()
        page.select_option("select[name=loadShape]", "step-ramp")
        expect(users).not_to_be_editable()  # the ramp drives the users: the field says so
        expect(page.get_by_text("Number of users: set by the step ramp")).to_be_visible()
        page.fill("input[name=rampSteps]", ",".join(map(str, STEPS)))
        page.fill("input[name=rampHold]", str(HOLD_S))
        page.screenshot(path=str(tmp_path / "webui-charts-form.png"))
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
        page.screenshot(path=str(tmp_path / "webui-charts-live.png"))
        # streams in flight never above the users: none carried over from the tests before
        assert all(x["in_flight"] <= x["users"] for x in _samples(ui)), _samples(ui)

        _wait_state(ui, "stopped", 40)  # the shape ends the test after its last step
        expect(frame.locator("#steps tbody tr")).to_have_count(len(STEPS), timeout=15_000)
        steps = {c: _paths(frame, c) for c in ("sttft", "sitl", "stps")}
        assert steps == {
            "sttft": {"p50": 2, "p99": 2},
            "sitl": {"p99 per chunk": 2},
            "stps": {"output tok/s": 2},
        }
        xticks = frame.locator("#c-sttft text.xtick").evaluate_all("ts => ts.map(t => t.textContent)")
        assert all(t.isdigit() for t in xticks) and {"2", "4"} <= set(xticks), xticks  # integer concurrency
        concs = frame.locator("#steps tbody tr td:nth-child(2)").all_inner_texts()
        assert [int(c) for c in concs] == list(STEPS)
        page.screenshot(path=str(tmp_path / "webui-charts-steps.png"))
        # the screenshot shows the charts: the panel covers most of the page
        box = page.locator("#servesweep-charts-panel").bounding_box()
        assert box["width"] > 1000 and box["height"] > 800
    finally:
        page.context.close()

    # Locust's Aggregated row: the real requests only (the LLM rows are measurements of those requests)
    stats = _get_json(ui + "/stats/requests")["stats"]
    rows = {(r["method"], r["name"]): r for r in stats}
    post = next(r for (m, _n), r in rows.items() if m == "POST")
    agg = next(r for r in stats if r["name"] == "Aggregated")
    assert post["num_requests"] > 10 and agg["num_requests"] == post["num_requests"], stats
    assert rows[("LLM", "TTFT")]["num_requests"] == post["num_requests"] - post["num_failures"]


def _record(request_id: str, scheduled_s: float, ttft_ms: float) -> dict:
    """A successful streamed request as the user writes it (wall clock: monotonic offset 0)."""
    sent = int(scheduled_s * 1e9)
    first = sent + int(ttft_ms * 1e6)
    return {"request_id": request_id, "warmup": False, "scheduled_ns": sent, "sent_ns": sent, "mono_to_wall_ns": 0,
            "first_token_ns": first, "chunk_ns": [first, first + 10**7], "end_ns": first + 10**7,
            "completion_tokens": 2}  # fmt: skip


@pytest.mark.fast
def test_a_new_tests_samples_count_only_its_own_requests():
    """The previous test's last requests reach the buffer after it stopped (a worker ships them up to 3 s later):
    they are not the new test's, and its first samples (10 s windows) must not show their TTFT."""
    from types import SimpleNamespace

    from servesweep.client.charts import Series
    from servesweep.results.records import RecordBuffer

    buffer = RecordBuffer()
    env = SimpleNamespace(servesweep=SimpleNamespace(buffer=buffer, in_flight=0), runner=None)
    series = Series()
    t0 = 1_700_000_000.0
    buffer.add(_record("old-1", t0, ttft_ms=900.0))
    assert series.tick(env, None, now=t0 + 1)["ttft_p99_ms"] == pytest.approx(900.0)
    series.reset(now=t0 + 3)  # the next test starts
    buffer.add(_record("old-2", t0 + 2, ttft_ms=900.0))  # scheduled in the old test, arrived after its stop
    buffer.add(_record("new-1", t0 + 3.5, ttft_ms=20.0))
    first = series.tick(env, None, now=t0 + 4)
    assert first["ttft_p99_ms"] == pytest.approx(20.0) and first["ttft_p50_ms"] == pytest.approx(20.0)
    assert [s["t"] for s in series.samples] == [t0 + 4]  # the old test's samples are gone

"""The start form of servesweep's Locust web UI and its place on Locust's page, in a real browser (Debian Chromium
via Playwright) against one real Locust process (local runner, web UI) and the emulator, with screenshots.

What a user checks: the custom parameters come group by group as docs/workloads.md says (load shape with the ramp
first, prompt & output, workload, timeouts, advanced, then the SLO), each under its heading; every label is whole
(nothing cut at the field's width) and above its field; the "LLM charts" button covers none of Locust's own
controls (ABOUT, the top bar's buttons), before and during a test; the values of the last start are still there
after NEW and after a reload; `python locustfiles/llm.py --help` lists servesweep's options by group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from servesweep.config.point import GROUPS, knobs
from servesweep.net import free_port
from servesweep.sim.launch import start_sim

# assertions wait as long as actions (Playwright's 5 s default is an idle machine's): slow, never wrong
expect.set_options(timeout=30_000)

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "locustfiles" / "llm.py"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]  # fmt: skip
RAMP = ["--load-shape", "--ramp-steps", "--ramp-hold", "--ramp-spawn-rate"]  # the ramp: first in the form
# The form's headings in order: the knobs' groups (config.point.GROUPS), then --slo, which has none.
HEADINGS = [g.capitalize() for g in GROUPS] + ["SLO"]

pytestmark = pytest.mark.timeout(300)  # a 2-core machine under the whole suite (five workers)


def _form_name(cli: str) -> str:
    """An option's field name in Locust's form: its dest camel-cased (--ramp-steps -> rampSteps)."""
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), cli[2:].replace("-", "_"))


def _expected_groups() -> dict[str, str]:
    """Field name -> the heading it belongs under."""
    out = {_form_name(c): HEADINGS[0] for c in RAMP}
    out.update({_form_name(k.cli): k.group.capitalize() for k in knobs("form")})
    out["slo"] = "SLO"
    return out


def _state(ui: str) -> str:
    with urllib.request.urlopen(ui + "/stats/requests", timeout=5) as r:
        return json.load(r)["state"]


def _wait_state(ui: str, want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _state(ui) != want:
        assert time.monotonic() < deadline, f"not {want} within {timeout}s"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("form")
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"],
                   log_path=tmp / "sim.log") as sim:  # fmt: skip
        port = free_port()
        cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", sim.base_url, "--web-host",
               "127.0.0.1", "--web-port", str(port), "--prompt-tokens", "300", "--output-tokens", "16",
               "--stop-timeout", "10"]  # fmt: skip
        log = tmp / "locust.log"
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                start_new_session=True)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    _state(url)
                    break
                except OSError:
                    assert time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.3)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            pg.set_default_timeout(60_000)  # a 2-core machine under the whole suite: slow, never wrong
            yield pg
        finally:
            browser.close()


def open_form(page: Page, ui: str | None = None, after_test: bool = False) -> None:
    """The start form with its custom parameters open (through NEW when a test has run); ui: load the page first."""
    if ui is not None:
        page.goto(ui + "/")
    if after_test:
        page.get_by_role("button", name="New").click()  # waits for the page to see the test stopped
    summary = page.get_by_role("button", name="Custom parameters")
    if summary.get_attribute("aria-expanded") != "true":
        summary.click()
    expect(page.locator(".servesweep-group").first).to_be_visible()


def form_sequence(page: Page) -> list[tuple[str, str]]:
    """The custom parameters' panel from top to bottom: ("heading", title) and ("field", name) items."""
    items = page.locator(".servesweep-group").first.evaluate(
        """h => [...h.parentElement.children].map(c => c.dataset.servesweepGroup !== undefined
               ? ["heading", c.dataset.servesweepGroup]
               : ["field", c.querySelector("[name]")?.getAttribute("name") || ""])"""
    )
    return [(kind, v) for kind, v in items]


def overlaps(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def covered_controls(page: Page) -> list[str]:
    """Locust's visible buttons, links, tabs and fields that the LLM charts button's box overlaps."""
    mine = page.locator("#servesweep-charts-button").bounding_box()
    assert mine is not None and mine["width"] > 0
    boxes = page.locator(
        "button:visible, a:visible, [role=tab]:visible, input:visible, select:visible"
    ).evaluate_all(
        """es => es.filter(e => e.id !== "servesweep-charts-button").map(e => {
               const r = e.getBoundingClientRect();
               return [(e.textContent || e.name || e.tagName).trim().slice(0, 40),
                       {x: r.x, y: r.y, width: r.width, height: r.height}]; })"""
    )
    return [name for name, box in boxes if box["width"] and overlaps(mine, box)]


def test_help_lists_servesweep_options_by_group():
    # Locust answers `locust -f FILE --help` before importing FILE (locust issue 2917): run as a script, the
    # locustfile registers its options first, and Locust's help lists them under servesweep's titles.
    r = subprocess.run(
        [sys.executable, str(LOCUSTFILE), "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    titles = re.findall(r"^servesweep: (.+):$", r.stdout, re.M)
    assert titles == [*GROUPS, "run"], titles
    listed = set(re.findall(r"^  (--[a-z0-9-]+)", r.stdout, re.M))
    missing = {k.cli for k in knobs("form")} | set(RAMP) | {"--slo", "--records", "--metrics-port"}
    assert not missing - listed, sorted(missing - listed)
    load_shape = r.stdout.split("servesweep: load shape:")[1].split("servesweep: prompt & output:")[0]
    assert re.findall(r"^  (--[a-z0-9-]+)", load_shape, re.M)[:4] == RAMP  # the ramp first


def test_form_grouped_ramp_first_with_whole_labels(ui, page, tmp_path):
    open_form(page, ui)
    page.screenshot(path=str(tmp_path / "form.png"), full_page=True)
    seq = form_sequence(page)
    assert [t for kind, t in seq if kind == "heading"] == HEADINGS
    assert seq[0] == ("heading", HEADINGS[0])
    assert [n for kind, n in seq[1:5]] == [_form_name(c) for c in RAMP], seq[:6]
    # every field under its own group's heading, and every option of the table in the form
    want = _expected_groups()
    heading, seen = None, {}
    for kind, v in seq:
        if kind == "heading":
            heading = v
        else:
            seen[v] = heading
    assert seen == want

    labels = page.locator(".servesweep-group").first.evaluate(
        """h => [...h.parentElement.querySelectorAll("label")].map(l => {
               // a text field or select: its label's sibling; a checkbox sits inside its own label
               const field = l.querySelector("input") ? null : l.parentElement.querySelector("input, select");
               return {text: l.textContent, cut: l.scrollWidth > l.clientWidth || l.scrollHeight > l.clientHeight,
                       visible: l.getBoundingClientRect().width > 0,
                       above: !field || l.getBoundingClientRect().bottom <= field.getBoundingClientRect().top + 1}; })"""
    )
    assert len(labels) >= len(want)
    assert [x["text"] for x in labels if x["cut"] or not x["visible"]] == [], "labels cut or hidden"
    assert [x["text"] for x in labels if not x["above"]] == [], "a label overlaps its field"
    ramp_steps = next(x["text"] for x in labels if "(--ramp-steps)" in x["text"])
    # the help whole; the group is the heading above, not a prefix
    assert "comma-separated" in ramp_steps and "[load shape]" not in ramp_steps


def test_llm_charts_button_covers_none_of_locusts_controls(ui, page, tmp_path):
    page.goto(ui + "/")
    button = page.locator("#servesweep-charts-button")
    expect(button).to_be_visible()
    assert covered_controls(page) == []
    about = page.get_by_role("button", name="About")
    about.scroll_into_view_if_needed()
    assert not overlaps(button.bounding_box() or {}, about.bounding_box() or {})
    expect(about).to_be_visible()
    page.screenshot(path=str(tmp_path / "main.png"))
    for width in (1000, 800):  # a narrower window: the top bar's items are closer together
        page.set_viewport_size({"width": width, "height": 900})
        assert covered_controls(page) == [], width
    page.set_viewport_size({"width": 1400, "height": 1000})


def test_form_settings_survive_new_and_reload(ui, page, tmp_path):
    open_form(page, ui)
    page.select_option("select[name=loadShape]", "step-ramp")
    page.fill("input[name=rampSteps]", "1")
    page.fill("input[name=rampHold]", "2")
    page.fill("input[name=slo]", "ttft_p99<=5s")
    page.get_by_role("button", name="Start").click()
    _wait_state(ui, "running", 20)
    page.wait_for_timeout(600)  # the top bar shows the running test's controls (EDIT, STOP, RESET)
    assert covered_controls(page) == []
    page.screenshot(path=str(tmp_path / "running.png"))
    _wait_state(ui, "stopped", 30)  # the ramp's one step ends the test

    def settings() -> tuple[str, str, float, str]:
        return (
            page.locator("select[name=loadShape]").input_value(),
            page.locator("input[name=rampSteps]").input_value(),
            float(page.locator("input[name=rampHold]").input_value()),
            page.locator("input[name=slo]").input_value(),
        )

    want = ("step-ramp", "1", 2.0, "ttft_p99<=5s")
    open_form(page, after_test=True)  # NEW on the same page
    assert settings() == want
    open_form(page, ui, after_test=True)  # a reload, then NEW
    page.screenshot(path=str(tmp_path / "reloaded.png"), full_page=True)
    assert settings() == want


STATUS = re.compile("^(ready|spawning|running|cleanup|stopping|stopped)$")
GOING = re.compile("^(spawning|running|cleanup|stopping)$")  # a test's states: not at rest


def header_status(page: Page):
    """The state Locust's page shows in its top bar ("Status")."""
    return page.locator("header .MuiTypography-button").filter(has_text=STATUS)


def test_page_leaves_the_stop_once_the_test_has_stopped(ui, page, tmp_path):
    """Locust's page polls its stats only while a test spawns or runs (locust issues 2046, 2400): a poll that saw the
    stop ("cleanup" on a local runner, "stopping" on a master: the users finishing their streams within
    --stop-timeout) left the page there, without NEW, after the test had stopped (a CI run failed on it). A ramp
    whose streams outlast its step makes the stop last the stop timeout (10 s), five of the page's 2-second polls:
    the page shows the stop, then the stopped test and NEW.

    Between Start and the page's first poll this test asks Locust nothing: Locust answers /stats/requests from a
    2-second cache shared by every client (memoize in locust/web.py), and a step ramp's start passes through "ready"
    until the shape's first tick spawns the users (start_shape). This test polled Locust right after Start; under
    load its request fell in that moment, and the page's first poll, 2 s after Start, read the cached "ready": the
    page showed the start form for good, Locust's "cleanup" and "stopped" unseen (it failed 2 in ~10 loaded runs).
    ui.js now brings such a page back (test_page_follows_a_start_it_did_not_see); here the page sees the test
    itself, through its own polls. And the start check is for a state of this test: "not ready" also held for the
    last test's "stopped", still shown before the page took the start."""
    open_form(page, ui, after_test=_state(ui) == "stopped")
    page.select_option("select[name=loadShape]", "step-ramp")
    page.fill("input[name=rampSteps]", "1")
    page.fill("input[name=rampHold]", "1")
    page.fill("input[name=outputTokens]", "8000")  # streams longer than the step: the stop waits on them
    page.get_by_role("button", name="Start").click()
    status = header_status(page)
    expect(status).to_have_text(GOING)  # the page took the start (neither "ready" nor the last test's "stopped")
    # the page saw the stop (a local runner's; a master's: "stopping"), what left it stuck; its states are Locust's
    expect(status).to_have_text("cleanup")
    page.screenshot(path=str(tmp_path / "stopping.png"))
    _wait_state(ui, "stopped", 30)
    expect(status).to_have_text("stopped")
    page.get_by_role("button", name="New").click()
    page.screenshot(path=str(tmp_path / "after-stop.png"))


def test_page_follows_a_start_it_did_not_see(ui, page, tmp_path):
    """A page at rest ("ready", or "stopped" after a test) asks Locust nothing: a test it did not see start stays
    unseen. It is the page that read a start as "ready" or as the last test's "stopped" (Locust's cached answer of
    the start's moment, test_page_leaves_the_stop_once_the_test_has_stopped): it showed the start form while the
    test ran. ui.js asks Locust while the page is at rest and reloads it when a test is going; the LLM charts stay
    open. A test started by another client (a POST to /swarm) is the same page, deterministically."""
    page.goto(ui + "/")
    status = header_status(page)
    expect(status).to_have_text(_state(ui))  # at rest (the tests before stopped theirs)
    page.locator("#servesweep-charts-button").click()
    charts = page.locator("#servesweep-charts-panel")
    expect(charts).to_be_visible()
    form = {"user_count": "1", "spawn_rate": "1", "host": "", "load_shape": "step-ramp", "ramp_steps": "1",
            "ramp_hold": "3", "output_tokens": "8000"}  # fmt: skip
    req = urllib.request.Request(ui + "/swarm", data=urllib.parse.urlencode(form).encode())
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.load(r)["success"] is True
    expect(status).to_have_text(GOING)  # ~3 s of the step, then the 10 s stop: the page follows within 5 s
    expect(charts).to_be_visible()  # the reload kept the LLM charts open
    page.screenshot(path=str(tmp_path / "followed.png"))
    _wait_state(ui, "stopped", 30)
    expect(status).to_have_text("stopped")
    expect(page.get_by_role("button", name="New")).to_be_visible()

"""Locust's web UI with servesweep's LLM view, driven in a real browser (Debian Chromium via Playwright).

One real Locust master (web UI) with one real worker process against the emulator: a run started from the form
with custom LLM parameters, the live LLM tab checked against the per-request records, the user count changed
while running, the per-step CSV downloaded; then a step ramp chosen in the form, and bad ramp input refused.
(A step ramp from the command line of one process with the UI, no browser: tests/inlocust/test_step_ramp.py.)
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from playwright.sync_api import Page, expect, sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from servesweep.client.live_stats import Sketch
from servesweep.net import free_port
from servesweep.results.records import read_parquet
from servesweep.results.summary import summarize
from servesweep.results.table import results_table
from servesweep.sim.launch import start_sim

# assertions wait as long as actions (Playwright's 5 s default is an idle machine's): slow, never wrong
expect.set_options(timeout=30_000)

LOAD_COLUMNS = [c.header for c in results_table([]).columns]  # `servesweep load`'s table
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
SIM_ARGS = ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"]
CHROMIUM = "/usr/bin/chromium"
WORKER_REPORT_INTERVAL = (
    3.0  # locust.runners' (not imported: Locust monkey-patches the process that imports it)
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
# Started with one LLM setting, changed in the form: the records prove which one the run used.
CLI_PROMPT, CLI_OUTPUT = 300, 16
FORM_PROMPT, FORM_OUTPUT = 400, 24
FORM_SLO = "ttft<=60ms,tpot<=1s,ttft_p50<=5s,e2e_p99<=1ms,error_rate<=1%"


def _get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except ProcessLookupError:
            pass


class Stack:
    def __init__(self, ui: str, records: Path, steps_csv: Path, logs: list[Path]) -> None:
        self.ui = ui
        self.records = records
        self.steps_csv = steps_csv
        self.logs = logs

    def state(self) -> dict:
        return _get_json(self.ui + "/stats/requests")

    def wait_state(self, want: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            d = self.state()
            if d["state"] == want:
                return d
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"state {d['state']!r}, not {want!r} after {timeout}s\n{self.log_tail()}"
                )
            time.sleep(0.3)

    def quit(self) -> None:
        """SIGTERM the master (it quits its worker and writes the records), then the worker; wait for both."""
        for p in self.procs:
            _kill(p)
            assert p.returncode is not None

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:] for p in self.logs)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    with start_sim(SIM_ARGS, log_path=tmp_path_factory.mktemp("sim") / "sim.log") as s:
        yield s


@pytest.fixture(scope="module")
def stack(tmp_path_factory, sim):
    tmp = tmp_path_factory.mktemp("webui")
    procs: list[subprocess.Popen] = []
    try:
        mport, wport = free_port(), free_port()
        common = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "locustfiles" / "llm.py"),
            "--host",
            sim.base_url,
        ]
        llm = ["--prompt-tokens", str(CLI_PROMPT), "--output-tokens", str(CLI_OUTPUT)]
        master = [
            *common,
            *llm,
            "--master",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(mport),
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(wport),
            "--stop-timeout",
            "3",  # streams running at a stop finish (they take ~0.2 s); the worker is ready again after it
            "--records",
            str(tmp / "records.parquet"),
            "--steps-csv",
            str(tmp / "steps.csv"),
        ]
        worker = [*common, *llm, "--worker", "--master-host", "127.0.0.1", "--master-port", str(mport)]
        logs = [tmp / "master.log", tmp / "worker.log"]
        for cmd, log in ((master, logs[0]), (worker, logs[1])):
            with open(log, "wb") as f:
                procs.append(
                    subprocess.Popen(
                        cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        st = Stack(f"http://127.0.0.1:{wport}", tmp / "records.parquet", tmp / "steps.csv", logs)
        st.procs = procs
        deadline = time.monotonic() + 60
        while True:  # the UI answers and the worker has joined
            for p in procs:
                assert p.poll() is None, f"a Locust process exited with {p.returncode}\n{st.log_tail()}"
            try:
                if st.state()["worker_count"] == 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"no UI with one worker after 60 s\n{st.log_tail()}"
            time.sleep(0.3)
        yield st
    finally:
        for p in reversed(procs):
            _kill(p)


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            pg = ctx.new_page()
            pg.set_default_timeout(60_000)  # a 2-core machine under the whole suite: slow, never wrong
            yield pg
        finally:
            browser.close()


def read_table(page: Page) -> list[dict[str, str]]:
    """The visible tab's table as rows of {column title: cell text}."""
    table = page.locator("table:visible").first
    heads = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    rows = []
    for tr in table.locator("tbody tr").all():
        cells = [c.strip() for c in tr.locator("td").all_inner_texts()]
        rows.append(dict(zip(heads, cells, strict=True)))
    return rows


def llm_view(page: Page) -> dict[str, dict[str, str]]:
    page.get_by_role("tab", name="LLM", exact=True).click()
    return {r["Metric"]: r for r in read_table(page)}


def wait_llm(page: Page, ok, timeout: float = 30.0) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        v = llm_view(page)
        if v and ok(v):
            return v
        assert time.monotonic() < deadline, f"LLM tab never got there: {v}"
        page.wait_for_timeout(500)


def num(v: dict[str, dict[str, str]], metric: str, col: str = "value") -> float:
    return float(v[metric][col])


def start_from_form(page: Page, stack: Stack, users: int, fields: dict[str, str], selects: dict[str, str]):
    page.goto(stack.ui + "/")
    new = page.get_by_role("button", name="New")
    if new.count():
        new.click()
    page.fill("input[name=userCount]", str(users))
    page.fill("input[name=spawnRate]", str(users))
    page.get_by_text("Custom parameters").click()
    for name, value in fields.items():
        page.fill(f"input[name={name}]", value)
    for name, value in selects.items():
        page.select_option(f"select[name={name}]", value)
    start = page.get_by_role("button", name="Start")
    expect(start).to_be_enabled(timeout=15_000)  # disabled until the worker is ready again after a stop
    start.click()


def download_steps(page: Page) -> list[dict[str, str]]:
    page.get_by_role("tab", name="Download Data").click()
    with page.expect_download() as dl:
        page.get_by_text("Download LLM per-step summary CSV").click()
    text = Path(dl.value.path()).read_text()
    reader = csv.DictReader(io.StringIO(text))
    assert reader.fieldnames == ["step", *LOAD_COLUMNS, "start_utc", "duration_s"]
    return list(reader)


def latencies(table: pa.Table) -> dict[str, np.ndarray]:
    """TTFT, every chunk gap (ITL per chunk), ITL per token, TPOT and E2E (ms) of the successful requests, computed
    here from the records."""
    out: dict[str, list[float]] = {
        "ttft_ms": [],
        "itl_ms": [],
        "itl_per_token_ms": [],
        "tpot_ms": [],
        "e2e_ms": [],
    }
    for r in table.to_pylist():
        if r["error_class"] is not None or r["warmup"]:
            continue
        ch = r["chunk_ns"]
        out["ttft_ms"].append((r["first_token_ns"] - r["sent_ns"]) / 1e6)
        out["e2e_ms"].append((r["end_ns"] - r["sent_ns"]) / 1e6)
        gaps = np.diff(np.asarray(ch, dtype=np.float64)) / 1e6
        out["itl_ms"].extend(gaps.tolist())
        k = r.get("chunk_tokens")
        if k is not None and len(k) == len(ch):  # each gap over its chunk's tokens, once per token
            out["itl_per_token_ms"].extend(np.repeat(gaps / np.maximum(k[1:], 1), k[1:]).tolist())
        elif gaps.size and r["completion_tokens"] > 1:  # the request's mean tokens per gap
            out["itl_per_token_ms"].extend((gaps / ((r["completion_tokens"] - 1) / gaps.size)).tolist())
        if (
            len(ch) > 1 and r["completion_tokens"] > 1
        ):  # one token per chunk: the emulator without spec decoding
            out["tpot_ms"].append((ch[-1] - ch[0]) / 1e6 / (r["completion_tokens"] - 1))
    return {k: np.sort(np.asarray(v)) for k, v in out.items()}


def order_stat(sorted_values: np.ndarray, q: float) -> float:
    return float(sorted_values[int(q * (sorted_values.size - 1))])


def close(a: float, b: float, rel: float, abs_: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * abs(b), abs_)


def exporter_totals(url: str) -> dict[str, float]:
    """Counter totals (all label sets summed) from a Prometheus text endpoint."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name.endswith("_total"):
                out[fam.name] = out.get(fam.name, 0.0) + smp.value
    return out


def final_llm_view(page: Page, stack: Stack) -> dict[str, dict[str, str]]:
    """After a stop: the UI polls only while running, so wait for the workers' last reports, then reload."""
    time.sleep(WORKER_REPORT_INTERVAL + 1.5)
    page.reload()
    return wait_llm(page, lambda v: "requests ok" in v, timeout=10)


def in_window(table: pa.Table, start_ns: int, end_ns: int) -> pa.Table:
    wall = pc.add(table.column("scheduled_ns"), table.column("mono_to_wall_ns")).to_numpy()
    return table.filter(pa.array((wall >= start_ns) & (wall < end_ns)))


def load_table_row(summary: dict) -> dict[str, str]:
    """The row `servesweep load` prints for a summary, by column."""
    t = results_table([summary])
    return {c.header: str(next(iter(c.cells))) for c in t.columns}


def check_steps(rows: list[dict[str, str]], windows: list[dict], records: pa.Table, failures=False) -> None:
    """Each CSV row is the load table's row of the records scheduled inside its step, summarized here."""
    assert len(rows) == len(windows)
    for r, w in zip(rows, windows, strict=True):
        mine = summarize(in_window(records, w["start_ns"], w["end_ns"]))
        mine["point"] = {"concurrency": w["concurrency"]}
        assert mine["requests"]["ok"] > 0 and bool(mine["failures"]) == failures, mine["requests"]
        assert mine["prompt_tokens"]["max_abs_deviation_pct"] == 0.0  # the server counted the form's length
        assert {k: r[k] for k in LOAD_COLUMNS} == load_table_row(mine)
        assert float(r["duration_s"]) == pytest.approx((w["end_ns"] - w["start_ns"]) / 1e9, abs=0.002)


def test_form_run_live_tab_edit_stop_step_csv_and_step_ramp(stack, page):
    # --- 1. a manual run from the form, with LLM parameters other than the command line's
    start_from_form(
        page,
        stack,
        2,
        {"promptTokens": str(FORM_PROMPT), "outputTokens": str(FORM_OUTPUT), "slo": FORM_SLO},
        {"loadShape": "manual"},
    )
    stack.wait_state("running", 20)

    # The live tab fills while the test runs, with the form's parameters in effect (counted by the server).
    v = wait_llm(
        page, lambda v: v["TTFT ms"]["p50"] and float(v["output tok/s (last 10 s)"]["value"] or 0) > 0
    )
    assert num(v, "TTFT ms", "p50") > 0 and num(v, "per-request tok/s", "p50") > 0
    assert num(v, "completion tokens / request") == FORM_OUTPUT
    assert num(v, "prompt tokens / request (server)") == FORM_PROMPT
    assert num(v, "requests failed") == 0

    # Change the user count of the running test; the worker reports 3 users in the clients tab.
    page.get_by_role("button", name="Edit").click()
    page.fill("input[name=userCount]", "3")
    page.get_by_role("button", name="Update").click()
    page.get_by_role("tab", name="LLM clients").click()
    deadline = time.monotonic() + 20
    while True:
        clients = read_table(page)
        workers = [r for r in clients if r["Process"] != "master"]
        if workers and workers[0]["Users"] == "3":
            break
        assert time.monotonic() < deadline, f"clients tab: {clients}"
        page.wait_for_timeout(500)
    assert len(workers) == 1 and float(workers[0]["CPU % (one core)"]) >= 0
    assert any(r["Process"] == "master" for r in clients)
    page.wait_for_timeout(4000)  # some requests at 3 users
    # the charts' streams in flight on a master: the workers' open streams as they reported them, never more
    # than the users (issued - completed, which it was, grew with every stop)
    flight = [x["in_flight"] for x in _get_json(stack.ui + "/servesweep/series.json")["samples"]]
    assert flight and max(flight) >= 1 and all(f <= 3 for f in flight), flight

    page.get_by_role("button", name="Stop").click()
    stack.wait_state("stopped", 20)
    final1 = final_llm_view(page, stack)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webui-llm.png"), full_page=True)
    steps1 = download_steps(page)
    windows1 = _get_json(stack.ui + "/servesweep/live.json")["steps"]
    assert [int(r[LOAD_COLUMNS[0]]) for r in steps1] == [2, 3], steps1
    metrics1 = exporter_totals(stack.ui + "/metrics")
    between = time.time_ns()

    # --- 2. a step ramp chosen in the form; bad ramp input is refused first, naming the field
    form = {"user_count": "1", "spawn_rate": "1", "host": "", "load_shape": "step-ramp", "ramp_steps": "1,x"}
    req = urllib.request.Request(stack.ui + "/swarm", data=urllib.parse.urlencode(form).encode())
    d = json.load(urllib.request.urlopen(req, timeout=5))
    assert d["success"] is False and "ramp_steps" in d["message"] and "'x'" in d["message"], d
    assert stack.state()["state"] == "stopped"

    start_from_form(page, stack, 1, {"rampSteps": "1,2", "rampHold": "3"}, {"loadShape": "step-ramp"})
    stack.wait_state("running", 20)
    t = time.monotonic()
    stack.wait_state("stopped", 30)  # the shape ends the test by itself after its last step
    assert time.monotonic() - t >= 5
    time.sleep(WORKER_REPORT_INTERVAL + 1.5)
    steps2 = download_steps(page)
    windows2 = _get_json(stack.ui + "/servesweep/live.json")["steps"]
    assert [int(r[LOAD_COLUMNS[0]]) for r in steps2] == [1, 2], steps2
    for r in steps2:
        assert 3.0 <= float(r["duration_s"]) <= 8.0, r  # held 3 s once spawned; the shape ticks once a second
    # the steps tab shows the same rows (after the stop the UI polls no more: reload)
    page.reload()
    page.get_by_role("tab", name="LLM steps").click()
    expect(page.locator("table:visible tbody tr")).to_have_count(2)
    page.screenshot(path=str(ARTIFACTS / "webui-llm-steps.png"), full_page=True)
    assert read_table(page) == steps2
    # more users, more aggregate throughput on the emulator
    assert float(steps2[1][LOAD_COLUMNS[1]]) > float(steps2[0][LOAD_COLUMNS[1]])

    # --- 3. quit Locust: the master writes every record; check the UI's numbers against them
    stack.quit()
    records = read_parquet(stack.records)
    run1 = in_window(records, 0, between)
    s = summarize(run1, slos=FORM_SLO)
    lat1 = latencies(run1)
    assert s["requests"]["failed"] == 0 and s["requests"]["ok"] > 20
    assert int(final1["requests ok"]["value"]) == s["requests"]["ok"]
    assert num(final1, "output tokens") == s["output_tokens"] == s["requests"]["ok"] * FORM_OUTPUT
    assert close(num(final1, "output tok/s (run)"), s["output_tokens_per_s"], 0.005)
    for metric, key in (
        ("TTFT ms", "ttft_ms"),
        ("E2E ms", "e2e_ms"),
        ("TPOT ms", "tpot_ms"),
        ("ITL per chunk ms", "itl_ms"),
        ("ITL per token ms", "itl_per_token_ms"),
    ):
        for q in ("p50", "p90", "p99"):
            # the order statistic at rank q*(n-1) within the sketch's relative error, plus the UI's 2 decimals
            want = order_stat(lat1[key], float(q[1:]) / 100)
            # (the sketch answers with a bucket of the rank's neighbourhood: allow one more alpha for that)
            assert close(num(final1, metric, q), want, 2 * Sketch.ALPHA, 0.006), (
                metric,
                q,
                final1[metric],
                want,
            )
        assert close(num(final1, metric, "mean"), s[key]["mean"], 0.001, 0.01), (
            metric,
            final1[metric],
            s[key],
        )
        assert int(final1[metric]["count"]) == s[key]["n"]
    assert close(num(final1, "per-request tok/s", "mean"), s["decode_tokens_per_s"]["mean"], 0.001, 0.1)
    # the exporter beside the UI (what Prometheus scrapes for Grafana) counted the same run
    assert metrics1["servesweep_completion_tokens"] == s["output_tokens"]
    # SLOs from the form: goodput counted per request as the summary does; aggregate ones checked live
    gp = final1["goodput (ttft<=60ms, tpot<=1s)"]["value"]
    assert gp.startswith(f"{s['goodput']['requests']} req, {s['goodput']['ratio'] * 100:.1f}%"), (
        gp,
        s["goodput"],
    )
    assert final1["SLO ttft_p50<=5s"]["value"].endswith("PASS")
    assert final1["SLO e2e_p99<=1ms"]["value"].endswith("FAIL")
    assert final1["SLO error_rate<=1%"]["value"] == "0 PASS"
    check_steps(steps1, windows1, records)
    check_steps(steps2, windows2, records)
    # --steps-csv: written by the master at the last stop, again at quitting
    assert [int(x[LOAD_COLUMNS[0]]) for x in csv.DictReader(stack.steps_csv.open())] == [1, 2]


def _synthetic_records(n: int, seed: int = 1) -> list[dict]:
    """Records as the user writes them: three workers (own clock offsets), varied TTFT/ITL, some failures."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        w = i % 3
        sched = 10**12 + int(rng.integers(0, 60 * 10**9))
        sent = sched + int(rng.integers(0, 2 * 10**6))
        row = {
            "request_id": f"r{i}",
            "point_id": "p",
            "worker": f"w{w}",
            "user": i % 7,
            "warmup": i < 5,
            "scheduled_ns": sched,
            "sent_ns": sent,
            "target_prompt_tokens": 100,
            "target_output_tokens": 64,
            "mono_to_wall_ns": 1_700_000_000 * 10**9 + w * 10**6,
            "http_status": 200,
        }
        if i % 11 == 0:
            row.update(end_ns=sent + 5 * 10**6, error_class="http_429" if i % 2 else "timeout_stall")
        else:
            k = int(rng.integers(2, 80))
            gaps = rng.lognormal(np.log(8e6), 0.6, k - 1).astype(np.int64)
            first = sent + int(rng.lognormal(np.log(200e6), 1.0))
            chunks = [first, *(first + np.cumsum(gaps)).tolist()]
            row.update(
                first_token_ns=first,
                chunk_ns=chunks,
                end_ns=chunks[-1] + 10**6,
                completion_tokens=k,
                prompt_tokens=100,
                finish_reason="length",
            )
        rows.append(row)
    return rows


@pytest.mark.fast
def test_live_aggregate_merged_across_workers_matches_the_summary():
    import msgpack

    from servesweep.client.live_stats import LiveStats
    from servesweep.results.records import to_table

    rows = _synthetic_records(600)
    master = LiveStats()
    for w in range(3):  # each worker ships two deltas over Locust's wire format (msgpack)
        mine = [r for r in rows if r["worker"] == f"w{w}"]
        for part in (mine[: len(mine) // 2], mine[len(mine) // 2 :]):
            delta = LiveStats()
            for r in part:
                delta.add_record(r)
            master.merge_payload(msgpack.unpackb(msgpack.packb(delta.payload()), strict_map_key=False))
    snap = master.snapshot(now_s=0.0)
    s = summarize(to_table(rows))
    assert snap["requests"] == {"ok": s["requests"]["ok"], "failed": s["requests"]["failed"], "warmup": 5}
    assert snap["errors"] == s["failures"] and snap["output_tokens"] == s["output_tokens"]
    # one worker's clock is its own: the window is on the wall clock; here offsets differ by 1-2 ms
    assert close(snap["output_tps"], s["output_tokens_per_s"], 1e-4)
    for key, skey in (
        ("ttft_ms", "ttft_ms"),
        ("itl_ms", "itl_ms"),
        ("tpot_ms", "tpot_ms"),
        ("e2e_ms", "e2e_ms"),
    ):
        lat = snap["latency"][key]
        assert lat["n"] == s[skey]["n"] and close(lat["mean"], s[skey]["mean"], 1e-9)
        for q in ("p50", "p90", "p99"):
            # within the sketch's relative error of an order statistic next to numpy's interpolated one
            assert close(lat[q], s[skey][q], Sketch.ALPHA + 0.02), (key, q, lat[q], s[skey][q])
    assert close(snap["latency"]["decode_tps"]["mean"], s["decode_tokens_per_s"]["mean"], 1e-9)


@pytest.mark.fast
def test_sketch_relative_error_bound_and_merge_is_exact():
    rng = np.random.default_rng(7)
    values = rng.lognormal(3.0, 2.0, 20_000)  # 4 decades, as TTFT ms spans under load
    whole, a, b = Sketch(), Sketch(), Sketch()
    whole.add(values)
    a.add(values[:7000])
    for v in values[7000:7100]:
        b.add_one(float(v))
    b.add(values[7100:])
    a.merge(b)
    assert a.bins == whole.bins and a.count == whole.count == values.size
    srt = np.sort(values)
    for q in (0.01, 0.5, 0.9, 0.99, 0.999):
        exact = srt[int(q * (values.size - 1))]  # the order statistic the sketch looks up
        assert abs(whole.quantile(q) - exact) <= Sketch.ALPHA * exact * 1.0001, q
    assert Sketch().quantile(0.5) is None

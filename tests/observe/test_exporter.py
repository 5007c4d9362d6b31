"""ClientMetrics: names and types by Prometheus conventions (checked by the real promtool), definitions that agree
with the point summary, the HTTP endpoint, and errors that name what is wrong."""

from __future__ import annotations

import math
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servesweep.observe.exporter import LATENCY_BUCKETS, ClientMetrics
from servesweep.results.records import to_table
from servesweep.results.summary import summarize

MS = 1_000_000


def _record(i: int, *, point="p1", err=None, warm=False, chunk_tokens=True) -> dict:
    """A plausible finished request: first token after 40+i ms, then 8 chunks of 1-2 tokens every 10+i ms."""
    t0 = 10_000 * MS + i * 1000 * MS
    sched, sent = t0, t0 + (i % 3) * MS
    first = sent + (40 + i) * MS
    toks = [1, 2, 1, 2, 1, 1, 2, 1, 1]
    chunks = [first + k * (10 + i) * MS for k in range(len(toks))]
    rec = {
        "request_id": f"r{i}",
        "point_id": point,
        "worker": "h:1",
        "user": i % 4,
        "warmup": warm,
        "scheduled_ns": sched,
        "sent_ns": sent,
        "headers_ns": sent + MS,
        "first_token_ns": None if err else first,
        "chunk_ns": None if err else chunks,
        "chunk_tokens": (toks if chunk_tokens else None) if not err else None,
        "end_ns": (chunks[-1] + 2 * MS) if not err else sent + 5 * MS,
        "prompt_tokens": 100 + i,
        "completion_tokens": None if err else sum(toks),
        "cached_tokens": 0,
        "reasoning_tokens": None,
        "target_prompt_tokens": 100,
        "target_output_tokens": sum(toks),
        "finish_reason": None if err else "length",
        "http_status": 500 if err else 200,
        "error_class": err,
        "error_message": "boom" if err else None,
        "mono_to_wall_ns": 1_700_000_000 * 10**9,
    }
    return rec


def _families(m: ClientMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(m.text().decode())}


def _value(fams, name, sample_name=None, **labels) -> float:
    fam = fams[name]
    sample_name = sample_name or name
    hits = [
        s.value
        for s in fam.samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(hits) == 1, (name, sample_name, labels, hits)
    return hits[0]


def _fed(chunk_tokens=True) -> tuple[ClientMetrics, list[dict]]:
    m = ClientMetrics("run-a")
    m.point_started("p1", {"model": "qwen", "config": "tp1", "concurrency": 4, "prompt_tokens": 100})
    recs = [_record(i, chunk_tokens=chunk_tokens) for i in range(12)]
    recs += [_record(20, err="http_5xx"), _record(21, err="timeout_stall"), _record(22, err="http_5xx")]
    recs += [_record(30, warm=True)]
    for r in recs:
        m.observe(r)
    return m, recs


@pytest.mark.fast
def test_counts_by_outcome_and_class_and_tokens():
    m, recs = _fed()
    f = _families(m)
    lab = {"run_id": "run-a", "point_id": "p1", "model": "qwen", "config": "tp1"}
    assert _value(f, "servesweep_requests", "servesweep_requests_total", outcome="success", **lab) == 12
    assert _value(f, "servesweep_requests", "servesweep_requests_total", error_class="http_5xx", **lab) == 2
    assert (
        _value(f, "servesweep_requests", "servesweep_requests_total", error_class="timeout_stall", **lab) == 1
    )
    assert _value(f, "servesweep_warmup_requests", "servesweep_warmup_requests_total", **lab) == 1
    measured = [r for r in recs if not r["warmup"]]
    assert _value(f, "servesweep_prompt_tokens", "servesweep_prompt_tokens_total", **lab) == sum(
        r["prompt_tokens"] for r in measured
    )
    assert _value(f, "servesweep_completion_tokens", "servesweep_completion_tokens_total", **lab) == sum(
        r["completion_tokens"] or 0 for r in measured
    )
    info = _value(f, "servesweep_point_info", run_id="run-a", point_id="p1", concurrency="4", tp="")
    assert info == 1


@pytest.mark.fast
@pytest.mark.parametrize("chunk_tokens", [True, False])
def test_histogram_means_equal_the_point_summary(chunk_tokens):
    """Histogram _sum/_count is the exact mean: it must equal summary.py's mean for every latency, so the live view
    and the final table use one definition (docs/metrics.md)."""
    m, recs = _fed(chunk_tokens)
    s = summarize(to_table(recs))
    f = _families(m)
    lab = {"run_id": "run-a", "point_id": "p1"}
    for hist, key in [
        ("servesweep_ttft_seconds", "ttft_ms"),
        ("servesweep_e2e_seconds", "e2e_ms"),
        ("servesweep_tpot_seconds", "tpot_ms"),
        ("servesweep_itl_seconds", "itl_ms"),
        ("servesweep_itl_per_token_seconds", "itl_per_token_ms"),
        ("servesweep_schedule_lag_seconds", "schedule_lag_ms"),
    ]:
        total = _value(f, hist, hist + "_sum", **lab)
        count = _value(f, hist, hist + "_count", **lab)
        assert count > 0, hist
        assert math.isclose(total / count, s[key]["mean"] / 1e3, rel_tol=1e-9), (hist, total / count, s[key])
    # ITL per token counts each token once when the server said how many tokens each chunk carried.
    itl_count = _value(f, "servesweep_itl_per_token_seconds", "servesweep_itl_per_token_seconds_count", **lab)
    assert itl_count == (12 * 11 if chunk_tokens else 12 * 8)
    # ITL per chunk counts every gap once.
    assert _value(f, "servesweep_itl_seconds", "servesweep_itl_seconds_count", **lab) == s["itl_ms"]["n"]


@pytest.mark.fast
def test_buckets_cover_1ms_to_10min_and_are_cumulative():
    assert LATENCY_BUCKETS[0] == 0.001 and LATENCY_BUCKETS[-1] == 600.0
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))
    m, _ = _fed()
    f = _families(m)
    buckets = [
        (float(s.labels["le"]), s.value)
        for s in f["servesweep_ttft_seconds"].samples
        if s.name.endswith("_bucket")
    ]
    values = [v for _, v in buckets]
    assert values == sorted(values) and values[-1] == 12
    # TTFTs are 40..51 ms (+ send offsets): none at or below 30 ms, all at or below 75 ms
    assert dict(buckets)[0.03] == 0 and dict(buckets)[0.075] == 12


@pytest.mark.fast
def test_summary_gauges_kept_after_point_finished():
    m, recs = _fed()
    s = summarize(to_table(recs))
    m.point_finished("p1", s)
    m.point_started("p2", {"model": "qwen", "config": "tp1", "concurrency": 8})
    f = _families(m)
    lab = {"run_id": "run-a", "point_id": "p1"}
    assert math.isclose(
        _value(f, "servesweep_point_ttft_seconds", stat="p99", **lab), s["ttft_ms"]["p99"] / 1e3
    )
    assert math.isclose(
        _value(f, "servesweep_point_output_tokens_per_second", **lab), s["output_tokens_per_s"], rel_tol=1e-12
    )
    assert _value(f, "servesweep_point_failures", error_class="http_5xx", **lab) == 2
    assert _value(f, "servesweep_point_failed_requests", **lab) == 3
    assert _value(f, "servesweep_point_running", **lab) == 0
    assert _value(f, "servesweep_point_running", run_id="run-a", point_id="p2") == 1


def test_promtool_check_metrics_is_clean():
    m, recs = _fed()
    m.point_finished("p1", summarize(to_table(recs)))
    m.set_users(4)
    m.set_target_rate(2.5)
    r = subprocess.run(["promtool", "check", "metrics"], input=m.text(), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == b"" and r.stderr.strip() == b"", r.stdout + r.stderr  # no lint warnings either


@pytest.mark.fast
def test_serves_on_loopback_and_users_from_a_callable():
    m, _ = _fed()
    n = {"users": 3}
    m.set_users(lambda: n["users"])
    port = m.serve(port=0)
    try:
        assert m._server.server_address[0] == "127.0.0.1"  # default bind: loopback only
        n["users"] = 7
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'servesweep_users_active{run_id="run-a"} 7.0' in body
        assert "servesweep_ttft_seconds_bucket" in body
    finally:
        m.stop()


@pytest.mark.fast
def test_bad_input_is_named():
    m = ClientMetrics("run-a")
    with pytest.raises(ValueError, match="no point_started\\('p9'\\)"):
        m.observe(_record(0, point="p9"))
    with pytest.raises(ValueError, match="axis name 'bad-name'"):
        m.point_started("p1", {"bad-name": 1})
    with pytest.raises(ValueError, match="unknown point 'p5'"):
        m.point_finished("p5", {})
    with pytest.raises(ValueError, match="run_id"):
        ClientMetrics("")


LOCUSTFILE = """
import os

from locust import events

from servesweep.client.exporter_feed import install_locust
from servesweep.observe.exporter import ClientMetrics
from servesweep.client.locustfile import LLMUser  # noqa: F401  servesweep's user, options and point set-up, unchanged


@events.init.add_listener
def _metrics(environment, **_kw):
    install_locust(environment, ClientMetrics("locust-run"), serve=("127.0.0.1", int(os.environ["METRICS_PORT"])))
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str) -> dict[tuple, float] | None:
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_locust_web_ui_and_headless_endpoint_expose_live_metrics(tmp_path):
    """A real Locust (web UI, autostarted) against the real emulator: /metrics on the web UI app and on the
    exporter's own port both show users and requests while the test runs."""
    import os
    import signal
    import sys
    import time

    from servesweep.sim.launch import start_sim

    lf = tmp_path / "lf.py"
    lf.write_text(LOCUSTFILE)
    web_port, metrics_port = _free_port(), _free_port()
    with start_sim(["--model-path", "qwen3.6-35b-a3b"], log_path=tmp_path / "sim.log") as sim:
        cmd = [sys.executable, "-m", "locust", "-f", str(lf), "--host", sim.base_url, "--web-host", "127.0.0.1",
               "--web-port", str(web_port), "--autostart", "-u", "3", "-r", "3", "-t", "6s", "--autoquit", "0",
               "--prompt-tokens", "200", "--output-tokens", "16", "--model", "qwen3.6-35b-a3b"]  # fmt: skip
        env = {**os.environ, "METRICS_PORT": str(metrics_port)}
        with open(tmp_path / "locust.log", "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            seen_ui = seen_own = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None and not (seen_ui and seen_own):
                for url in (
                    f"http://127.0.0.1:{web_port}/metrics",
                    f"http://127.0.0.1:{metrics_port}/metrics",
                ):
                    s = _scrape(url)
                    if not s:
                        continue
                    users = s.get(("servesweep_users_active", (("run_id", "locust-run"),)))
                    ok = sum(v for (n, lab), v in s.items() if n == "servesweep_requests_total")
                    if users == 3 and ok > 0:
                        if "web" in url or str(web_port) in url:
                            seen_ui = s
                        else:
                            seen_own = s
                time.sleep(0.3)
            log_tail = (tmp_path / "locust.log").read_text()[-3000:]
            assert seen_ui, (
                f"the web UI's /metrics never showed 3 users and requests; locust.log:\n{log_tail}"
            )
            assert seen_own, f"the exporter port never showed 3 users and requests; locust.log:\n{log_tail}"
            # the point is the one servesweep's locustfile built from the options, with its axes
            (info,) = [dict(lab) for (n, lab), v in seen_own.items() if n == "servesweep_point_info"]
            assert (
                info["concurrency"] == "3"
                and info["prompt_tokens"] == "200"
                and info["output_tokens"] == "16"
            )
            assert info["model"] == "qwen3.6-35b-a3b" and info["workload"] == "chat"
            ttft = [
                v
                for (n, lab), v in seen_own.items()
                if n == "servesweep_ttft_seconds_count" and dict(lab)["point_id"] == info["point_id"]
            ]
            assert ttft and ttft[0] > 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)

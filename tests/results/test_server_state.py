"""The server's state during a point (results/server_state.py; sampled by driver/point_run.py's ServerSampler): SGLang's
/metrics reduced with prometheus_client's parser, label sets combined, gauges' mean and max, counters' increase;
a real point against the emulator as a hybrid model (Qwen3.6: mamba state slots) with a KV pool small enough that
requests queue and get retracted; the report's "Server state" table; a server without SGLang's metrics."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest

from servesweep.results.server_state import NotSGLang, StateAccumulator, read_exposition, server_state

LABELS = 'engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


def exposition(
    *,
    usage=(0.5, 0.25),
    running=(3, 4),
    queue=(1, 0),
    mamba=(0.2, 0.4),
    mamba_pool=True,
    gen=(100, 20),
    retracted: float | None = None,
    queue_time: tuple[tuple[float, float], ...] | None = None,
) -> str:
    """SGLang's exposition with two DP ranks (dp_rank label on the scheduler's families), its exact names and label
    sets: num_retracted_reqs with its pid label, the tokenizer counters per is_streaming (0.5.20+)."""
    lines = []

    def fam(name: str, kind: str, rows: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} x")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{lab}}} {v}" for lab, v in rows)

    def per_rank(vals) -> list[tuple[str, float]]:
        return [(f'dp_rank="{i}",{LABELS}', float(v)) for i, v in enumerate(vals)]

    fam("sglang:num_running_reqs", "gauge", per_rank(running))
    fam("sglang:num_queue_reqs", "gauge", per_rank(queue))
    fam("sglang:token_usage", "gauge", per_rank(usage))
    fam("sglang:swa_token_usage", "gauge", per_rank((0, 0)))
    fam("sglang:mamba_usage", "gauge", per_rank(mamba))
    fam("sglang:utilization", "gauge", per_rank((0, 0)))
    fam("sglang:num_paused_reqs", "gauge", per_rank((0, 0)))
    fam(
        "sglang:num_retracted_reqs",
        "gauge",
        [(f'dp_rank="{i}",{LABELS},pid="{900 + i}"', 1.0) for i in (0, 1)],
    )
    if mamba_pool:
        fam("sglang:mamba_available_tokens", "gauge", per_rank((200, 180)))
        fam("sglang:mamba_used_tokens", "gauge", per_rank((6, 8)))
    if retracted is not None:  # multiprocess mode: the family appears with the first retraction
        fam("sglang:num_retracted_requests_total", "counter", per_rank((retracted, 0)))
    tok = 'engine_type="unified",is_streaming="{}",model_name="qwen"'
    fam(
        "sglang:generation_tokens_total",
        "counter",
        [(tok.format("true"), gen[0]), (tok.format("false"), gen[1])],
    )
    fam("sglang:prompt_tokens_total", "counter", [(tok.format("true"), 1000.0)])
    fam("sglang:num_aborted_requests_total", "counter", [('engine_type="unified",model_name="qwen"', 0.0)])
    fam("sglang:time_to_first_token_seconds", "histogram", [])
    lines.append(f'sglang:time_to_first_token_seconds_bucket{{le="0.1",{LABELS}}} 3.0')
    # the scheduler's histogram per DP rank, ((sum, count) per rank): from its first observation
    if queue_time is not None:
        fam("sglang:queue_time_seconds", "histogram", [])
        for i, (total, n) in enumerate(queue_time):
            lab = f'dp_rank="{i}",{LABELS}'
            lines.append(f'sglang:queue_time_seconds_bucket{{le="+Inf",{lab}}} {float(n)}')
            lines.append(f"sglang:queue_time_seconds_sum{{{lab}}} {float(total)}")
            lines.append(f"sglang:queue_time_seconds_count{{{lab}}} {float(n)}")
    return "\n".join(lines) + "\n"


@pytest.mark.fast
def test_one_exposition_combines_label_sets_max_for_usage_sum_over_dp_ranks_for_counts():
    got = read_exposition(exposition())
    assert got["sglang:token_usage"] == 0.5  # the busiest rank's pool
    assert got["sglang:mamba_usage"] == 0.4
    assert got["sglang:num_running_reqs"] == 7  # 3 + 4: each DP rank runs its own requests
    assert got["sglang:num_queue_reqs"] == 1
    assert got["sglang:num_retracted_reqs"] == 2  # one per rank (each its own pid series)
    assert got["sglang:generation_tokens_total"] == 120  # streaming and not, summed
    assert "sglang:num_retracted_requests_total" not in got  # no retraction yet: no sample
    assert "sglang:time_to_first_token_seconds_bucket" not in got  # only what server_state reads is kept


@pytest.mark.fast
def test_a_point_gauges_mean_and_max_counters_increase_over_the_samples():
    samples = [
        (10.0, exposition(usage=(0.1, 0.0), running=(1, 0), gen=(100, 20))),
        (11.0, exposition(usage=(0.9, 0.2), running=(5, 4), queue=(3, 2), gen=(400, 20), retracted=2)),
        (12.0, exposition(usage=(0.2, 0.0), running=(0, 0), queue=(0, 0), gen=(700, 20), retracted=5)),
    ]
    st = server_state(samples)
    assert st["samples"] == 3 and st["interval_s"] == 1.0 and st["span_s"] == 2.0
    g = st["gauges"]
    assert g["token_usage"] == {"mean": pytest.approx(0.4), "max": 0.9}
    assert g["num_running_reqs"] == {"mean": pytest.approx(10 / 3), "max": 9}
    assert g["num_queue_reqs"]["max"] == 5 and isinstance(g["num_queue_reqs"]["max"], int)
    assert g["mamba_usage"] == {"mean": pytest.approx(0.4), "max": 0.4}
    assert g["utilization"] == {"mean": 0.0, "max": 0.0}
    assert g["swa_token_usage"] is None  # always written as 0 by SGLang; no SWA pool here
    c = st["counters"]
    # the retraction counter appeared mid-point (absent = 0 in SGLang's multiprocess mode)
    assert c == {"retracted_requests": 5, "aborted_requests": 0, "prompt_tokens": 0, "generation_tokens": 600,
                 "queue_time_s": 0, "queue_time_count": 0}  # fmt: skip
    # a server restarted mid-point: the counter starts again from 0, and its new count is added
    restart = [samples[0], (11.0, exposition(gen=(30, 0))), (12.0, exposition(gen=(50, 0)))]
    assert server_state(restart)["counters"]["generation_tokens"] == 50


@pytest.mark.fast
def test_queue_time_over_a_point_from_the_schedulers_histogram():
    """sglang:queue_time_seconds (one observation per request, at its first forward): its _sum's and _count's
    increase over the point, the DP ranks' summed; absent before the first request (multiprocess mode: 0); a
    restart mid-point counts its new observations from 0."""
    got = read_exposition(exposition(queue_time=((1.5, 3), (0.25, 2))))
    assert got["sglang:queue_time_seconds_sum"] == 1.75 and got["sglang:queue_time_seconds_count"] == 5
    assert "sglang:queue_time_seconds_bucket" not in got
    # --enable-metrics-for-all-schedulers: each TP rank of a DP rank observes the same requests (max, not sum)
    tp_rank1 = LABELS.replace('tp_rank="0"', 'tp_rank="1"')
    tp1 = exposition(queue_time=((1.5, 3),)) + f'sglang:queue_time_seconds_sum{{dp_rank="0",{tp_rank1}}} 1.5\n'
    assert read_exposition(tp1)["sglang:queue_time_seconds_sum"] == 1.5

    samples = [
        (0.0, exposition()),  # before the point's first request: no observation yet, no series
        (1.0, exposition(queue_time=((0.5, 2), (0.0, 1)))),
        (2.0, exposition(queue_time=((4.5, 4), (0.5, 2)))),
    ]
    c = server_state(samples)["counters"]
    assert c["queue_time_s"] == pytest.approx(5.0) and c["queue_time_count"] == 6
    # the server restarted between the samples: its new histogram (1.25 s over 2 requests) adds to the 5.0 s before
    restart = [*samples, (3.0, exposition(queue_time=((1.0, 1), (0.25, 1))))]
    c = server_state(restart)["counters"]
    assert c["queue_time_s"] == pytest.approx(6.25) and c["queue_time_count"] == 8
    # a server whose exposition never has the family (an older SGLang, no request yet): 0, the key kept
    assert server_state([(0.0, exposition()), (1.0, exposition())])["counters"]["queue_time_s"] == 0


@pytest.mark.fast
def test_a_point_of_hours_keeps_a_few_numbers_not_its_samples():
    """Field scale: the sampler reduces each sample at once. 10x a long point (a 3-hour soak at 1/s is 10,800
    samples; here 108,000): the accumulator's memory stays flat and its figures equal the ones computed from the
    whole list (mean, max, a counter's increase across two server restarts)."""
    import tracemalloc

    def snap(i: int) -> dict[str, float]:
        gen = float(i % 40_000) * 7  # the server restarted twice: the counter falls back to 0
        return {"sglang:token_usage": (i % 97) / 100, "sglang:num_running_reqs": float(i % 13),
                "sglang:generation_tokens_total": gen}  # fmt: skip

    n = 108_000
    acc = StateAccumulator()
    acc.add(0.0, snap(0))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(1, n):
        acc.add(float(i), snap(i))
    grown = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    st = acc.result()
    assert grown < 16_000, f"the accumulator grew by {grown} bytes over {n} samples"
    usage = [(i % 97) / 100 for i in range(n)]
    assert st["samples"] == n and st["span_s"] == n - 1 and st["interval_s"] == 1.0
    assert st["gauges"]["token_usage"] == {"mean": pytest.approx(sum(usage) / n), "max": 0.96}
    assert st["gauges"]["num_running_reqs"]["max"] == 12
    # increase: 0 -> 39,999 x 7, then from 0 again twice (the first sample after each restart counts as new)
    assert st["counters"]["generation_tokens"] == sum(snap(i)["sglang:generation_tokens_total"] - (
        snap(i - 1)["sglang:generation_tokens_total"] if i % 40_000 else 0) for i in range(1, n))  # fmt: skip


@pytest.mark.fast
def test_mamba_usage_only_for_a_server_with_a_mamba_pool():
    # SGLang writes mamba_usage 0 for every model; without the pool's size (before 0.5.23) a 0 throughout means none
    flat = [
        (0.0, exposition(mamba=(0, 0), mamba_pool=False)),
        (1.0, exposition(mamba=(0, 0), mamba_pool=False)),
    ]
    assert server_state(flat)["gauges"]["mamba_usage"] is None
    idle_hybrid = [(0.0, exposition(mamba=(0, 0), mamba_pool=True))]  # a pool, no request running yet
    assert server_state(idle_hybrid)["gauges"]["mamba_usage"] == {"mean": 0.0, "max": 0.0}


@pytest.mark.fast
def test_other_servers_give_no_server_state():
    vllm = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n"
    with pytest.raises(NotSGLang):
        read_exposition(vllm)
    assert server_state([(0.0, vllm), (1.0, vllm)]) is None
    assert server_state([]) is None
    # an answer that is not Prometheus text is skipped, the rest counts
    assert server_state([(0.0, "<html>not found</html>{"), (1.0, exposition())])["samples"] == 1


class _FakeServer:
    """/metrics answers `status` with `body`; every request's Authorization header is kept."""

    def __init__(self, status: int, body: str, stall_s: float = 0.0):
        seen = self.auth = []

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                seen.append((self.path, self.headers.get("Authorization")))
                time.sleep(stall_s)  # a server too busy to answer /metrics in time
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sampler gave up waiting (the stall test)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize(
    "status,body,why",
    [
        (404, "Not Found", "answered HTTP 404"),
        (
            200,
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n",
            "no sglang:* series",
        ),
    ],
)
@pytest.mark.fast
def test_the_sampler_sends_the_key_and_gives_up_on_a_server_without_sglang_metrics(
    monkeypatch, status, body, why
):
    from servesweep.config.point import LoadPoint
    from servesweep.driver.point_run import ServerSampler

    monkeypatch.setenv("SS_TEST_KEY", "sk-sampler-secret")
    srv = _FakeServer(status, body)
    try:
        point = LoadPoint(
            base_url=srv.base_url,
            model="m",
            api_key_env="SS_TEST_KEY",
            probe=False,
            concurrency=1,
            requests=1,
        )
        s = ServerSampler(point, interval_s=0.05).start()
        time.sleep(0.3)
        s.stop()
        state, note = s.summary()
    finally:
        srv.close()
    assert srv.auth == [("/metrics", "Bearer sk-sampler-secret")]  # asked once, with the key; then left alone
    assert state is None and why in note and "sk-sampler-secret" not in note


@pytest.mark.fast
def test_a_metrics_endpoint_that_hangs_ten_times_the_timeout_never_holds_the_point():
    """Field scale, compressed: each /metrics answer takes 10x the sampler's timeout (2 s against 0.2 s). Every
    request is cut at the timeout and retried at the next interval (a timeout is transient), stopping takes about
    one timeout, not the stall, and the point gets no server state with the reason, never an exception."""
    from servesweep.config.point import LoadPoint
    from servesweep.driver.point_run import ServerSampler

    srv = _FakeServer(200, exposition(), stall_s=2.0)
    try:
        point = LoadPoint(base_url=srv.base_url, model="m", probe=False, concurrency=1, requests=1)
        t0 = time.monotonic()
        s = ServerSampler(point, interval_s=0.05, timeout_s=0.2).start()
        started = time.monotonic() - t0
        time.sleep(1.0)
        t1 = time.monotonic()
        s.stop()
        stopped = time.monotonic() - t1
        state, note = s.summary()
    finally:
        srv.close()
    assert started < 1.0 and stopped < 1.0, (started, stopped)  # each wait bounded by the timeout, not the stall
    assert len(srv.auth) >= 4  # asked again after each timeout (1 s of 0.2 s timeouts and 0.05 s intervals)
    assert state is None and note.startswith("GET /metrics"), note


EMULATOR = [
    "--model-path", "Qwen/Qwen3.6-27B", "--enable-metrics", "--sim-sglang-version", "0.5.23",
    "--max-running-requests", "8", "--max-total-tokens", "3000", "--context-length", "4096",
    "--sim-calibration", "speedup=8", "--api-key", "sk-emulator-secret",
]  # fmt: skip


@pytest.mark.timeout(300)
def test_a_point_against_a_hybrid_model_records_the_servers_state_and_the_report_shows_it(
    tmp_path, monkeypatch
):
    """12 users against 8 running slots and a 3000-token KV pool: requests queue, and decode runs out of KV
    (retractions); Qwen3.6's running requests hold mamba state slots."""
    from servesweep.config.point import LoadPoint
    from servesweep.driver.point_run import run_point
    from servesweep.results.report import FEW_SAMPLES, MIN_GAUGE_SAMPLES, queue_s_per_request, write_report
    from servesweep.sim.launch import start_sim

    monkeypatch.setenv("SS_TEST_KEY", "sk-emulator-secret")
    out = tmp_path / "point"
    with start_sim(EMULATOR) as sim:
        # the emulator's real exposition: every family server_state reads, as SGLang 0.5.23 names them
        raw = urllib.request.urlopen(sim.base_url + "/metrics", timeout=10).read().decode()
        names = set(read_exposition(raw))
        assert {"sglang:utilization", "sglang:token_usage", "sglang:mamba_usage", "sglang:num_running_reqs",
                "sglang:num_queue_reqs", "sglang:num_paused_reqs", "sglang:num_retracted_reqs",
                "sglang:mamba_available_tokens", "sglang:generation_tokens_total"} <= names  # fmt: skip
        req = urllib.request.Request(
            sim.base_url + "/server_info", headers={"Authorization": "Bearer sk-emulator-secret"}
        )
        info = json.loads(urllib.request.urlopen(req, timeout=10).read())
        point = LoadPoint(
            base_url=sim.base_url, model="Qwen/Qwen3.6-27B", api_key_env="SS_TEST_KEY", probe=False,
            template_overhead=0, continuous_usage=False, endpoint="chat", concurrency=12, prompt_tokens=400,
            output_tokens=160, requests=24, warmup_s=0,
        )  # fmt: skip
        summary = run_point(point, out)
    st = summary["server_state"]
    assert st is not None, summary.get("server_state_note")
    # about once a second (the last sample: when the point ended)
    assert st["samples"] >= 2 and 0.3 <= st["interval_s"] <= 3, st
    g, c = st["gauges"], st["counters"]
    assert 0 < g["token_usage"]["max"] <= 1 and 0 < g["mamba_usage"]["max"] <= 1, g
    # SGLang's utilization = max(running / max_running_requests_under_SLO, token_usage / 0.9); 0.5.11 to 0.5.23
    # never set that cap and leave it at 0, and the emulator does the same: 0, not a number in (0, 1]
    assert g["utilization"] == {"mean": 0.0, "max": 0.0}
    assert 1 <= g["num_running_reqs"]["max"] <= info["max_running_requests"] == 8
    assert g["num_queue_reqs"]["max"] >= 1  # 12 users, at most 8 running
    assert c["retracted_requests"] >= 1 and c["aborted_requests"] == 0, c
    assert g["swa_token_usage"] is None
    # the server's counter against the client's own count: every request of the point finished before the last
    # sample (taken after Locust exited), no probe ran during the point, so they agree exactly
    t = pq.read_table(out / "records.parquet", columns=["completion_tokens", "prompt_tokens"])
    assert c["generation_tokens"] == sum(t.column("completion_tokens").to_pylist()) == 24 * 160
    assert c["prompt_tokens"] == sum(t.column("prompt_tokens").to_pylist())
    text = (out / "summary.json").read_text()
    assert json.loads(text)["server_state"] == st and "sk-emulator-secret" not in text

    _, md_path = write_report(out)
    md = md_path.read_text()
    assert "sk-emulator-secret" not in md + (out / "report.html").read_text()
    section = md[md.index("### Server state") :]
    header, _, row = section.splitlines()[2:5]
    cells = dict(
        zip(*([c.strip() for c in line.strip("|").split("|")] for line in (header, row)), strict=True)
    )
    print(section[: section.index("\n\n", section.index("| chat"))])
    # utilization read 0 in every sample (SGLang up to 0.5.23 never sets it): left out, the table says why
    assert "utilization mean" not in cells and "utilization: left out, every sample read 0" in section
    # the gauges where the point had enough samples to read its load, else the cells say why not
    few = st["samples"] < MIN_GAUGE_SAMPLES
    assert cells["token usage max"] == (FEW_SAMPLES if few else f"{g['token_usage']['max']:.2f}")
    assert cells["running max"] == (FEW_SAMPLES if few else str(g["num_running_reqs"]["max"]))
    assert cells["queue max"] == (FEW_SAMPLES if few else str(g["num_queue_reqs"]["max"]))
    # the mean queue time per request from the histogram's increase (the emulator does not observe it yet: "-")
    per_req = queue_s_per_request(st)
    assert cells["queue s/req"] == ("-" if per_req is None else f"{per_req:.2f}")
    assert cells["retractions"] == str(c["retracted_requests"])
    assert cells["mamba usage max"] == (FEW_SAMPLES if few else f"{g['mamba_usage']['max']:.2f}")
    assert cells["samples"] == str(st["samples"])
    html = (out / "report.html").read_text()
    assert (
        'class="server-state"' in html
        and f'data-key="retractions" data-value="{c["retracted_requests"]}"' in html
    )

    # the same point with 2 samples (a point of a second: the one before its load and the one after): its gauges
    # would read the idle server, so they are not shown and the row says why; its counters still are
    short = tmp_path / "short"
    shutil.copytree(out, short, ignore=shutil.ignore_patterns("report.*"))
    s = json.loads((short / "summary.json").read_text())
    s["server_state"].update(samples=2, span_s=1.0)
    (short / "summary.json").write_text(json.dumps(s))
    html_path, short_md = write_report(short)
    text = short_md.read_text()
    row = next(line for line in text[text.index("### Server state") :].splitlines() if line.startswith("| chat"))
    assert row.count(FEW_SAMPLES) == 4 and f"| {c['retracted_requests']} | 2 |" in row, row
    html = html_path.read_text()
    assert 'colspan="4" data-key="gauges" data-samples="2">too few samples (2 over 1.0 s)' in html

    # a point folder written before server_state existed still renders, the table's place saying so
    old = tmp_path / "old"
    shutil.copytree(out, old, ignore=shutil.ignore_patterns("report.*"))
    s = json.loads((old / "summary.json").read_text())
    del s["server_state"]
    (old / "summary.json").write_text(json.dumps(s))
    _, old_md = write_report(old)
    assert "Server state: — (not recorded for these points)." in old_md.read_text()
    assert "not recorded for these points" in (old / "report.html").read_text()

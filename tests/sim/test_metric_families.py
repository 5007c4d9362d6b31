"""Every metric family SGLang's /metrics holds whatever the configuration is in the emulator's, with its type, per
emulated version (0.5.11 and 0.5.23).

The expectation is read from SGLang's own source, installed per version by `sglang_reference.install`:
`SchedulerMetricsCollector.log_stats` (run at every log interval with --enable-metrics) and `emit_constants` (run
once at start-up) in `observability/metrics_collector.py`; each `self._log_gauge(self.X, ...)` outside any `if` sets
a family, and `self.X = Gauge(name=..., ...)` in the class names it. SGLang exposes through prometheus_client's
multiprocess mode, which writes no `_created` samples: the emulator must not either.
"""

from __future__ import annotations

import ast
import json
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sglang_reference import install

from servesweep.sim.events import CPU_INTERVAL_S
from servesweep.sim.launch import start_sim
from servesweep.sim.probe import http

VERSIONS = ["0.5.11", "0.5.23"]
SET_CALLS = ("_log_gauge", "_log_gauge_queue_count")


def unconditional_families(version: str) -> dict[str, str]:
    """{family: type} that SGLang's scheduler collector sets unconditionally, from its source."""
    path = install(version) / "sglang/srt/observability/metrics_collector.py"
    cls = next(n for n in ast.parse(path.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "SchedulerMetricsCollector")  # fmt: skip
    declared = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            kind = getattr(node.value.func, "id", getattr(node.value.func, "attr", ""))
            name = {k.arg: k.value for k in node.value.keywords}.get("name")
            if kind in ("Gauge", "Counter", "Histogram") and isinstance(name, ast.Constant):
                declared[node.targets[0].attr] = (name.value, kind.lower())
    out = {}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in ("log_stats", "emit_constants"):
            for st in fn.body:  # top-level statements only: what sits under an `if` is conditional
                call = st.value if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) else None
                if call is not None and getattr(call.func, "attr", "") in SET_CALLS:
                    name, kind = declared[call.args[0].attr]
                    out[name] = kind
    return out


def scrape(sim) -> dict[str, object]:
    status, _, body = http("GET", sim.base_url + "/metrics")
    assert status == 200
    text = body.decode()
    assert "_created" not in text  # multiprocess mode writes none
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_unconditional_family_is_there_with_its_type(version):
    want = unconditional_families(version)
    assert len(want) >= 30  # the source was read (0.5.11: 34 families, 0.5.23: 49)
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--enable-metrics", "--sim-sglang-version", version]) as sim:
        got = scrape(sim)
    missing = sorted(n for n in want if n not in got)
    assert not missing, f"SGLang {version} always emits {missing}"
    wrong = {n: (got[n].type, t) for n, t in want.items() if got[n].type != t}
    assert not wrong


def test_gauges_follow_the_engine():
    """While a request of a hybrid model (Qwen3.6: Gated DeltaNet state slots) decodes: its sequence length is in
    decode_sum_seq_lens, it holds its mamba state slots, the engine was busy; afterwards the slots are free."""
    args = ["--model-path", "Qwen/Qwen3.6-27B", "--enable-metrics", "--sim-sglang-version", "0.5.23",
            "--context-length", "8192"]  # fmt: skip
    with start_sim(args) as sim:
        body = json.dumps({"prompt": "word " * 500, "max_tokens": 400, "ignore_eos": True}).encode()
        done = threading.Event()
        threading.Thread(target=lambda: (http("POST", sim.base_url + "/v1/completions", body,
                                              {"content-type": "application/json"}), done.set())).start()  # fmt: skip
        scrape(sim)  # the first scrape starts fwd_occupancy's window
        seen = None
        while not done.wait(0.2):
            m = scrape(sim)
            if m["sglang:num_running_reqs"].samples[0].value == 1:
                seen = m
                break
        assert seen is not None, "the request never showed as running"
        val = {n: f.samples[0].value for n, f in seen.items() if f.type == "gauge" and f.samples}
        assert val["sglang:decode_sum_seq_lens"] > 500
        assert val["sglang:mamba_used_tokens"] >= 1 and val["sglang:mamba_available_tokens"] > 0
        assert 0 < val["sglang:fwd_occupancy"] <= 100
        assert val["sglang:new_token_ratio"] > 0
        done.wait(60)
        after = scrape(sim)
        assert after["sglang:mamba_used_tokens"].samples[0].value == 0


# The families SGLang sets only on an event (sim/events.py), and the function of SGLang's source that sets each.
EVENT_FAMILIES = {
    "sglang:num_retracted_requests": ("counter", "increment_retracted_reqs"),
    "sglang:num_retracted_input_tokens": ("counter", "increment_retracted_reqs"),
    "sglang:num_retracted_output_tokens": ("counter", "increment_retracted_reqs"),
    "sglang:realtime_tokens": ("counter", "increment_realtime_tokens"),
    "sglang:per_stage_req_latency_seconds": ("histogram", "observe_per_stage_req_latency"),
}


@pytest.mark.parametrize("version", VERSIONS)
def test_event_families_are_sglangs_and_set_only_in_their_event_function(version):
    """Each family is declared in SchedulerMetricsCollector and set (.inc/.observe) only in the one method SGLang
    calls on its event, and process_cpu_seconds_total only by cpu_monitor's thread: none is set unconditionally."""
    src = install(version) / "sglang/srt/observability"
    text = (src / "metrics_collector.py").read_text()
    cls = next(n for n in ast.parse(text).body
               if isinstance(n, ast.ClassDef) and n.name == "SchedulerMetricsCollector")  # fmt: skip
    attr_of = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            name = {k.arg: k.value for k in node.value.keywords}.get("name")
            if isinstance(name, ast.Constant) and isinstance(node.targets[0], ast.Attribute):
                attr_of[name.value.removesuffix("_total")] = node.targets[0].attr
    for family, (_, setter) in EVENT_FAMILIES.items():
        attr = attr_of[family]
        users = {fn.name for fn in cls.body if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"
                 and f"self.{attr}." in ast.unparse(fn)}  # fmt: skip
        assert users == {setter}, (family, users)
    assert not set(EVENT_FAMILIES) & set(unconditional_families(version))
    cpu = (src / "cpu_monitor.py").read_text()
    assert 'name="sglang:process_cpu_seconds_total"' in cpu and "time.sleep(interval)" in cpu


def _counter(fams, name, **labels) -> float:
    return sum(s.value for s in fams[name].samples if all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("version", VERSIONS)
def test_event_families_appear_after_their_event_with_the_engines_values(version):
    """None of them before its event; after 10 requests too many for the KV pool (the engine retracts), every one,
    with values that add up: decode tokens are the generated tokens less the ones each prefill samples, computed plus
    cached prefill tokens are the prompts plus every retracted request's replay, one stage sample per request."""
    n, out = 10, 600
    args = ["--model-path", "Qwen/Qwen3.6-27B", "--enable-metrics", "--sim-sglang-version", version,
            "--max-total-tokens", "4000", "--chunked-prefill-size", "256", "--sim-calibration", "speedup=8"]  # fmt: skip
    t0 = time.monotonic()
    with start_sim(args) as sim:
        first = scrape(sim)
        early = time.monotonic() - t0 < CPU_INTERVAL_S  # the CPU monitor started after t0: not yet ticked
        assert not [f for f in [*EVENT_FAMILIES, "sglang:process_cpu_seconds"] if f in first and
                    (early or f != "sglang:process_cpu_seconds")]  # fmt: skip
        usage = []

        def one(i):
            body = json.dumps({"prompt": f"{i} " + "word " * 300, "max_tokens": out, "ignore_eos": True}).encode()
            st, _, resp = http("POST", sim.base_url + "/v1/completions", body, {"content-type": "application/json"})
            assert st == 200
            usage.append(json.loads(resp)["usage"])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        m = scrape(sim)
        while "sglang:process_cpu_seconds" not in m and time.monotonic() - t0 < 4 * CPU_INTERVAL_S:
            time.sleep(0.25)  # the monitor's first tick: CPU_INTERVAL_S after the emulator's start
            m = scrape(sim)
    assert len(usage) == n and all(u["completion_tokens"] == out for u in usage)
    for family, (kind, _) in EVENT_FAMILIES.items():
        assert family in m and m[family].type == kind, family
    retracted = _counter(m, "sglang:num_retracted_requests")
    assert retracted >= 1
    prompt = usage[0]["prompt_tokens"]
    assert all(u["prompt_tokens"] == prompt for u in usage)
    assert _counter(m, "sglang:num_retracted_input_tokens") == retracted * prompt
    replayed_out = _counter(m, "sglang:num_retracted_output_tokens")
    assert 0 < replayed_out < retracted * out
    rt = {s.labels["mode"]: s.value for s in m["sglang:realtime_tokens"].samples}
    assert rt["decode"] == n * out - n - retracted  # each prefill (first, and after a retraction) samples one
    assert rt["prefill_compute"] + rt.get("prefill_cache", 0) == n * prompt + retracted * prompt + replayed_out
    stages = {s.labels["stage"]: s.value for s in m["sglang:per_stage_req_latency_seconds"].samples
              if s.name.endswith("_count")}  # fmt: skip
    assert stages["request_process"] == n and stages["prefill_forward"] == n
    assert stages["chunked_prefill"] >= n  # 300-token prompts in 256-token chunks
    cpu = m["sglang:process_cpu_seconds"]
    assert cpu.type == "counter" and [s.labels for s in cpu.samples] == [{"component": "tokenizer"}]
    assert cpu.samples[0].value > 0

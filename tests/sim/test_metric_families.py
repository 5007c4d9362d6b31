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

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sglang_reference import install

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

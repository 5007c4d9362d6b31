"""The emulator's power model (sim/power.py) and its NVML-shaped stand-in, GET /sim/gpu: idle and loaded power
in the profile's range, an energy counter that the integral of the power readings matches, the power cap's clock,
and the throttle fault."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from servesweep.sglang.gpus import GPU_PROFILES
from servesweep.sim.launch import start_sim
from servesweep.sim.power import POWER_PROFILES, SW_POWER_CAP, GpuMeter, demand_w, power_profile
from servesweep.sim.probe import probe, run

MODEL = "Qwen/Qwen3.6-27B"


def test_every_gpu_profile_has_a_power_profile_with_its_sources():
    assert set(POWER_PROFILES) == set(GPU_PROFILES)
    h200 = power_profile("H200")
    assert (h200.idle_w, h200.tdp_w, h200.min_limit_w, h200.max_limit_w) == (120.0, 700.0, 200.0, 700.0)
    for p in POWER_PROFILES.values():
        assert 0 < p.idle_w < p.load_w <= p.tdp_w and p.source
        assert demand_w(p, 0) == p.idle_w and demand_w(p, 1) == p.load_w and demand_w(p, 2) == p.load_w


def test_meter_counter_is_the_exact_integral_of_the_busy_share():
    now = [0.0]
    busy = [0.0]
    m = GpuMeter("H200", 2, lambda: busy[0], memory_total_bytes=1, memory_used_bytes=1, clock=lambda: now[0])
    for _ in range(10):  # 50% busy for 10 s
        now[0] += 1.0
        busy[0] += 0.5
        doc = m.read()
    g = doc["gpus"][0]
    assert len(doc["gpus"]) == 2 and g["util_pct"] == 50
    assert g["power_w"] == pytest.approx(120 + 0.5 * (700 - 120))
    assert g["energy_mj"] / 1000 == pytest.approx(10 * (120 + 0.5 * 580), rel=1e-6)
    for _ in range(3):  # fully busy: at the 700 W cap, SM clock as measured there
        now[0] += 1.0
        busy[0] += 1.0
        g = m.read()["gpus"][0]
    assert (
        g["power_w"] == pytest.approx(700)
        and g["throttle_reasons"] & SW_POWER_CAP
        and g["sm_clock_mhz"] == 1480
    )
    m.configure(power_limit_w=300)
    now[0] += 1.0
    busy[0] += 1.0
    g = m.read()["gpus"][0]
    assert g["power_w"] == pytest.approx(300) and g["power_limit_w"] == 300
    with pytest.raises(ValueError, match="outside H200's range 200-700 W"):
        m.configure(power_limit_w=150)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _load(sim, n: int, stop: threading.Event) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "ignore_eos": True,
        "stream": True,
    }

    def one():
        while not stop.is_set():
            run(probe(sim.host, sim.port, "/v1/chat/completions", body, timeout=30))

    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()


def test_sim_gpu_counter_agrees_with_integrated_power_under_load_and_a_throttle_fault_shows(tmp_path):
    with start_sim(["--model-path", MODEL, "--tp-size", "2", "--sim-calibration", "speedup=0.5"]) as sim:
        url = f"http://{sim.host}:{sim.port}/sim/gpu"
        idle = _get(url)["gpus"]
        assert len(idle) == 2 and idle[0]["util_pct"] == 0 and idle[0]["power_w"] == pytest.approx(120, abs=1)
        stop = threading.Event()
        _load(sim, 8, stop)
        samples = []
        try:
            for _ in range(12):
                time.sleep(0.5)
                samples.append((time.monotonic(), _get(url)["gpus"][0]))
            code, doc = _post(url, {"throttle": "thermal"})
            time.sleep(0.3)
            throttled = _get(url)["gpus"][0]
        finally:
            stop.set()
        assert code == 200
        (t0, g0), (t1, g1) = samples[2], samples[-1]
        counter_j = (g1["energy_mj"] - g0["energy_mj"]) / 1000
        integral_j = sum(
            (b[0] - a[0]) * (a[1]["power_w"] + b[1]["power_w"]) / 2
            for a, b in zip(samples[2:], samples[3:], strict=False)
        )
        assert abs(integral_j - counter_j) / counter_j < 0.05, (counter_j, integral_j)
        assert 120 < counter_j / (t1 - t0) <= 700
        assert max(g["util_pct"] for _, g in samples) > 20
        assert throttled["throttle_reasons"] & 0x40 and throttled["temp_c"] == 90
        assert throttled["sm_clock_mhz"] < 1980 * 0.7
        assert _post(url, {"power_limit_w": 900})[0] == 400
        assert _post(url, {"throttle": "none", "power_limit_w": 450})[1]["gpus"][0]["power_limit_w"] == 450

"""The GPU sampler (ansible/roles/sglang_server/files/gpu_sampler.py) as the role runs it, a real process: against
the emulator's /sim/gpu, against an NVML module (a stand-in pynvml with one GPU lacking the energy counter), with
no source at all, and its pidfile discipline (only the recorded process is ever signalled)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servesweep.driver.ansible import ansible_dir
from servesweep.sim.launch import start_sim

SAMPLER = ansible_dir() / "roles" / "sglang_server" / "files" / "gpu_sampler.py"
MODEL = "Qwen/Qwen3.6-27B"


def sampler(*args: str, env: dict | None = None) -> dict:
    r = subprocess.run(
        [sys.executable, str(SAMPLER), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


def families(url: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(get(url + "/metrics").decode())}


def test_sampler_reads_the_emulator_serves_prometheus_and_samples_and_exits_with_the_server(tmp_path):
    with start_sim(["--model-path", MODEL, "--tp-size", "2"]) as sim:
        out = sampler(
            "--state",
            "started",
            "--workdir",
            str(tmp_path),
            "--sim-url",
            f"http://127.0.0.1:{sim.port}/sim/gpu",
            "--interval",
            "0.2",
            "--watch-pid",
            str(sim.proc.pid),
        )
        pid = int(out["pid"])
        assert (
            out["running"]
            and out["source"] == "sim"
            and out["gpus"] == 2
            and out["energy_sources"] == ["counter"]
        )
        assert (tmp_path / "gpu_sampler.pid").read_text().split()[0] == str(pid)
        time.sleep(1.0)
        fam = families(out["url"])
        power = {s.labels["gpu"]: s.value for s in fam["servesweep_gpu_power_watts"].samples}
        assert power == {"0": pytest.approx(120, abs=1), "1": pytest.approx(120, abs=1)}
        assert fam["servesweep_gpu_energy_joules"].type == "counter"
        for name in (
            "servesweep_gpu_utilization_ratio",
            "servesweep_gpu_sm_clock_hertz",
            "servesweep_gpu_memory_used_bytes",
            "servesweep_gpu_temperature_celsius",
            "servesweep_gpu_clock_event_reasons",
            "servesweep_gpu_throttled",
        ):
            assert len(fam[name].samples) == 2, name
        doc = json.loads(get(f"{out['url']}/samples?since={time.time() - 0.7}"))
        assert doc["source"] == "sim" and 2 <= len(doc["samples"]) <= 5
        lines = (tmp_path / "gpu_samples.jsonl").read_text().splitlines()
        assert len(lines) >= 5 and json.loads(lines[-1])["gpus"][1]["energy_source"] == "counter"
        assert alive(pid)
    assert wait_gone(pid, 3.0), "the sampler exits once the server it watches is gone"
    assert not (tmp_path / "gpu_sampler.pid").exists()
    assert "the server (pid" in (tmp_path / "gpu_sampler.log").read_text()


FAKE_PYNVML = """
class NVMLError(Exception):
    pass
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
class _U:
    gpu, memory = 97, 40
class _M:
    used, total = 100 << 30, 141 << 30
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return b"NVIDIA H200"
def nvmlDeviceGetUUID(h): return f"GPU-fake-{h}"
def nvmlDeviceGetUtilizationRates(h): return _U()
def nvmlDeviceGetMemoryInfo(h): return _M()
def nvmlDeviceGetClockInfo(h, c): return 1665 if c == NVML_CLOCK_SM else 3201
def nvmlDeviceGetPowerUsage(h): return 650000
def nvmlDeviceGetEnforcedPowerLimit(h): return 700000
def nvmlDeviceGetTemperature(h, s): return 61
def nvmlDeviceGetCurrentClocksEventReasons(h): return 0x4
import time
_T0 = time.time()
def nvmlDeviceGetTotalEnergyConsumption(h):
    if h == 1:
        raise NVMLError("Not Supported")
    return int(650 * (time.time() - _T0) * 1000)
# link counters: GPU 0 has PCIe byte counters (2 MB/s out, 5 MB/s in) and two NVLink links (1 MiB/s each out, in
# KiB); GPU 1 has none of them (an older driver): its PCIe rate comes from nvmlDeviceGetPcieThroughput (KB/s)
class _V:
    def __init__(self, v): self.ullVal = v
class _F:
    def __init__(self, fid, scope, ret, v): self.fieldId, self.scopeId, self.nvmlReturn, self.value = fid, scope, ret, _V(v)
def nvmlDeviceGetFieldValues(h, ids):
    if h == 1:
        raise NVMLError("Function Not Found")
    dt = time.time() - _T0
    rate = {197: 2e6, 198: 5e6, 138: 1024.0, 139: 512.0}
    out = []
    for fid, scope in ids:
        ok = fid in (197, 198) or (fid in (138, 139) and scope < 2)
        out.append(_F(fid, scope, 0 if ok else 3, int(10**9 + rate.get(fid, 0) * dt) if ok else 0))
    return out
def nvmlDeviceGetPcieThroughput(h, counter): return 3000 if counter == 0 else 4000
"""


def test_sampler_reads_nvml_and_integrates_power_only_where_the_counter_is_missing(tmp_path):
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "pynvml.py").write_text(textwrap.dedent(FAKE_PYNVML))
    work = tmp_path / "w"
    out = sampler(
        "--state", "started", "--workdir", str(work), "--interval", "0.2", env={"PYTHONPATH": str(mod)}
    )
    try:
        assert out["running"] and out["source"] == "nvml" and out["gpus"] == 2
        assert out["energy_sources"] == ["counter", "integrated_power"]
        time.sleep(1.2)
        samples = json.loads(get(out["url"] + "/samples"))["samples"]
        first, last = samples[0], samples[-1]
        g0, g1 = last["gpus"]
        assert (g0["energy_source"], g1["energy_source"]) == ("counter", "integrated_power")
        assert g1["energy_mj"] / 1000 == pytest.approx(650 * (last["t"] - first["t"]), rel=0.02)
        assert (g0["util_pct"], g0["sm_clock_mhz"], g0["power_w"], g0["throttle_reasons"]) == (
            97,
            1665,
            650,
            4,
        )
        # link traffic: counters and their rates (GPU 0), the 20 ms throughput call where the counters are missing
        assert g0["pcie_tx_bps"] == pytest.approx(2e6, rel=0.05) and g0["pcie_rx_bps"] == pytest.approx(
            5e6, rel=0.05
        )
        assert (
            g0["nvlink_tx_bytes"] > 2 * 1024 * 10**9 and g0["pcie_tx_bytes"] > 10**9
        )  # 2 links summed, KiB -> B
        assert g0["nvlink_tx_bps"] == pytest.approx(2 * 1024 * 1024, rel=0.05)
        assert g0["nvlink_rx_bps"] == pytest.approx(2 * 512 * 1024, rel=0.05)
        assert (g1["pcie_tx_bps"], g1["pcie_rx_bps"], g1["pcie_tx_bytes"], g1["nvlink_tx_bytes"]) == (
            3e6,
            4e6,
            None,
            None,
        )
        fam = families(out["url"])
        pcie_total = fam["servesweep_gpu_pcie_transmit_bytes"].samples  # a counter: its family drops _total
        assert {s.labels["gpu"] for s in pcie_total if s.name.endswith("_total")} == {"0"}
        rates = {
            s.labels["gpu"]: s.value for s in fam["servesweep_gpu_pcie_transmit_bytes_per_second"].samples
        }
        assert rates["1"] == 3e6 and rates["0"] == pytest.approx(2e6, rel=0.05)
        assert {s.labels["gpu"] for s in fam["servesweep_gpu_nvlink_receive_bytes_per_second"].samples} == {
            "0"
        }
        src = {
            s.labels["gpu"]: s.labels["energy_source"]
            for s in fam["servesweep_gpu_energy_source_info"].samples
        }
        assert src == {"0": "counter", "1": "integrated_power"}
        assert {s.value for s in fam["servesweep_gpu_power_capped"].samples} == {1}
        assert {s.value for s in fam["servesweep_gpu_throttled"].samples} == {0}
    finally:
        stopped = sampler("--state", "stopped", "--workdir", str(work))
    assert stopped["changed"] and wait_gone(int(out["pid"]))
    assert not (work / "gpu_sampler.pid").exists()


def test_no_source_starts_nothing_and_says_why(tmp_path):
    out = sampler("--state", "started", "--workdir", str(tmp_path), "--source", "auto")
    assert not out["running"] and not out["pid"] and "no NVML" in out["reason"]
    assert not (tmp_path / "gpu_sampler.pid").exists()


def test_a_pidfile_naming_another_process_is_never_signalled(tmp_path):
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "gpu_sampler.pid").write_text(f"{stranger.pid} 1\n")  # same pid, another start time
        out = sampler("--state", "stopped", "--workdir", str(tmp_path))
        assert not out["changed"] and stranger.poll() is None
        assert not (tmp_path / "gpu_sampler.pid").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_memory_and_file_stay_bounded_far_past_their_limits(tmp_path):
    """Field scale, compressed: 20 samples a second against a 0.5 s memory and a 2 kB file: after 6 times the
    memory's span the buffer holds its bound only and the file has rotated, neither grew."""
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "pynvml.py").write_text(textwrap.dedent(FAKE_PYNVML))
    work = tmp_path / "w"
    out = sampler(
        "--state",
        "started",
        "--workdir",
        str(work),
        "--interval",
        "0.05",
        "--keep-s",
        "0.5",
        "--max-file-mb",
        "0.002",
        env={"PYTHONPATH": str(mod)},
    )
    try:
        time.sleep(3.0)
        fam = families(out["url"])
        taken = fam["servesweep_gpu_sampler_samples"].samples[0].value
        kept = json.loads(get(out["url"] + "/samples"))["samples"]
        # the bound: keep_s / interval + 1 samples, at least 16
        assert taken >= 30 and len(kept) <= 16 and kept[-1]["t"] - kept[0]["t"] < 1.0
        line = len((work / "gpu_samples.jsonl.1").read_text().splitlines()[0]) + 1
        assert (work / "gpu_samples.jsonl").stat().st_size <= 2000 + line
        assert (work / "gpu_samples.jsonl.1").stat().st_size <= 2000 + line
    finally:
        sampler("--state", "stopped", "--workdir", str(work))


def test_sampler_reads_a_dcgm_exporter(tmp_path):
    """`--source dcgm:URL`: a dcgm-exporter's metric names and labels (the emulator's /sim/dcgm, which a
    Prometheus parser reads too) give the same per-GPU figures as the NVML-shaped /sim/gpu."""
    with start_sim(["--model-path", MODEL, "--tp-size", "2"]) as sim:
        base = f"http://127.0.0.1:{sim.port}"
        dcgm = {f.name: f for f in text_string_to_metric_families(get(base + "/sim/dcgm").decode())}
        s0 = dcgm["DCGM_FI_DEV_POWER_USAGE"].samples[0]
        assert s0.labels["gpu"] == "0" and s0.labels["modelName"].startswith("NVIDIA H200")
        assert dcgm["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
        out = sampler(
            "--state",
            "started",
            "--workdir",
            str(tmp_path),
            "--source",
            f"dcgm:{base}/sim/dcgm",
            "--interval",
            "0.2",
            "--watch-pid",
            str(sim.proc.pid),
        )
        try:
            assert out["running"] and out["source"] == "dcgm" and out["gpus"] == 2
            time.sleep(0.6)
            g = json.loads(get(out["url"] + "/samples"))["samples"][-1]["gpus"][1]
            ref = json.loads(get(base + "/sim/gpu"))["gpus"][1]
            assert g["energy_source"] == "counter" and g["energy_mj"] > 0 and g["uuid"] == ref["uuid"]
            for k in ("util_pct", "sm_clock_mhz", "mem_clock_mhz", "power_limit_w", "throttle_reasons"):
                assert g[k] == ref[k], k
            assert g["power_w"] == pytest.approx(ref["power_w"], abs=1)
            assert g["mem_total_bytes"] == pytest.approx(ref["mem_total_bytes"], rel=1e-5)
        finally:
            sampler("--state", "stopped", "--workdir", str(tmp_path))


def test_only_the_servers_own_gpus_are_sampled(tmp_path):
    """`--gpus` (the role passes the server's CUDA_VISIBLE_DEVICES): a packed server's sampler reports its GPUs only."""
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "pynvml.py").write_text(textwrap.dedent(FAKE_PYNVML))
    work = tmp_path / "w"
    out = sampler(
        "--state",
        "started",
        "--workdir",
        str(work),
        "--interval",
        "0.2",
        "--gpus",
        "GPU-fake-1",
        env={"PYTHONPATH": str(mod)},
    )
    try:
        assert out["gpus"] == 1
        last = json.loads(get(out["url"] + "/samples"))["samples"][-1]
        assert [g["uuid"] for g in last["gpus"]] == ["GPU-fake-1"]
    finally:
        sampler("--state", "stopped", "--workdir", str(work))

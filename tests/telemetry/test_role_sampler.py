"""The sglang_server role starts the GPU sampler beside the server and stops it with it (real ansible-runner runs
on localhost, the emulator as the server, its /sim/gpu as the NVML stand-in): the sampler's URL comes back with the
resolved server, a point run against it gets its gpu.json, applying the role again keeps both, and a stop ends both.
The same runs carry a power limit (the gpu_power_limit_w axis): set through the emulator's NVML stand-in before the
server starts, what the driver accepted handed back, the emulator and the point's gpu.json under it, the original
restored when the server stops."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

from support import with_server_argv

from servesweep.config.point import LoadPoint
from servesweep.driver.ansible import local_inventory, run_playbook
from servesweep.driver.point_run import run_point
from servesweep.net import free_port

MODEL = "Qwen/Qwen3.6-27B"


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_role_starts_the_sampler_with_the_server_and_stops_it_with_it(tmp_path):
    port = free_port()
    work = tmp_path / "server"
    n = [0]

    def apply(state: str):
        n[0] += 1
        return run_playbook(
            "sglang_server.yml",
            inventory=local_inventory(),
            extravars=with_server_argv({
                "sglang_server_state": state,
                "sglang_server_model_path": MODEL,
                "sglang_server_port": port,
                "sglang_server_python": sys.executable,
                "sglang_server_emulator": True,
                "sglang_server_workdir": str(work),
                "sglang_server_startup_timeout": 120,
                "sglang_server_stop_timeout": 20,
                "sglang_server_gather_facts": False,
                "sglang_server_gpu_sampler": True,
                "sglang_server_flags": {"tp_size": 2, "gpu_power_limit_w": 450},
            }, sim_args={"sim_load_time": 0.2}),
            artifact_dir=tmp_path / "artifacts",
            ident=f"t{n[0]}",
            timeout_s=300,
        )

    a = apply("started")
    server_pid = sampler_pid = 0
    try:
        assert a.ok, a.error()
        gs = a.artifact_data["sglang_server"]["gpu_sampler"]
        assert gs["running"] and gs["source"] == "sim" and gs["gpus"] == 2, gs
        pl = a.artifact_data["sglang_server"]["power_limit"]
        assert {(g["original_w"], g["accepted_w"], g["via"]) for g in pl["gpus"]} == {(700.0, 450.0, "nvml")}, pl
        assert "--sim-nvml-state" in a.artifact_data["sglang_server"]["argv"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/gpu", timeout=10) as r:
            assert {g["power_limit_w"] for g in json.loads(r.read())["gpus"]} == {450.0}
        server_pid, sampler_pid = int(a.artifact_data["sglang_server"]["pid"]), int(gs["pid"])
        assert (work / "gpu_sampler.pid").read_text().split()[0] == str(sampler_pid)
        with urllib.request.urlopen(gs["url"] + "/metrics", timeout=10) as r:
            assert "servesweep_gpu_energy_joules_total{" in r.read().decode()
        time.sleep(1.0)
        p = LoadPoint(
            base_url=f"http://127.0.0.1:{port}",
            model=MODEL,
            probe=False,
            concurrency=4,
            prompt_tokens=500,
            output_tokens=64,
            duration_s=2.0,
        )
        run_point(p, tmp_path / "point", gpu_telemetry=[gs["url"]])
        g = json.loads((tmp_path / "point" / "gpu.json").read_text())
        t = g["total"]
        assert t["gpus"] == 2 and t["joules_per_output_token"] > 0 and t["idle_w"] > 0
        assert {x["power_limit_w"] for x in g["gpus"]} == {450.0} and t["power_avg_w"] <= 2 * 450

        again = apply("started")  # the same server: kept, and its sampler too (its samples with it)
        assert again.ok, again.error()
        assert int(again.artifact_data["sglang_server"]["gpu_sampler"]["pid"]) == sampler_pid
        assert alive(sampler_pid)
    finally:
        stop = apply("stopped")
    assert stop.ok, stop.error()
    assert not alive(server_pid) and not alive(sampler_pid), "the sampler stops with the server"
    assert not (work / "gpu_sampler.pid").exists()
    state = json.loads((work / "sim_nvml.json").read_text())
    assert set(state["limits_mw"].values()) == {700_000}, "the original limit is back once the server stopped"
    assert not (work / "gpu_power_limit.json").exists()

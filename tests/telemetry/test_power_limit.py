"""The power-limit axis below the planner: the sglang_server role's script (files/gpu_power_limit.py) against the
emulator's NVML stand-in (sim/power.py SimNvml) — set, record the originals, keep them across a set that was never
restored (a crash), restore, refuse out-of-range values and a denied set — and the power model under a limit: the
step model slows compute-bound prefill by the clock the limit leaves and barely touches memory-bound decode, and
the emulator's meter follows the stand-in's state file (no server started here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servesweep.sglang.gpus import POWER_LIMIT_AXIS, get_gpu, power_limit_problem
from servesweep.sglang.serverargs import resolve_server
from servesweep.sglang.stepmodel import StepModel, calibration_for
from servesweep.sim.power import GpuMeter, SimNvml, power_profile, sim_uuid

SCRIPT = Path(__file__).parents[2] / "ansible" / "roles" / "sglang_server" / "files" / "gpu_power_limit.py"


def limit(work: Path, *args: str) -> tuple[int, dict]:
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--workdir",
            str(work),
            "--nvml",
            f"sim:{work / 'sim_nvml.json'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return r.returncode, json.loads(r.stdout)


def test_profiles_carry_the_range_and_the_planner_check_says_why():
    assert get_gpu("h200").power is not None and get_gpu("h200").power.problem(450) is None
    assert POWER_LIMIT_AXIS == "gpu_power_limit_w"
    why = power_limit_problem("H200", 150)
    assert why is not None and "150 W is outside the allowed range 200-700 W" in why
    assert power_limit_problem("RTX A6000", 300) is None and power_limit_problem("RTX A6000", 450) is not None
    assert "unknown GPU profile" in (power_limit_problem("B300", 500) or "")


def test_set_records_the_originals_keeps_them_across_a_crash_and_restores(tmp_path):
    state = tmp_path / "sim_nvml.json"
    rc, out = limit(tmp_path, "--state", "set", "--limit", "450", "--gpus", f"1,{sim_uuid(3)}")
    assert rc == 0 and out["changed"], out
    assert [(g["index"], g["original_w"], g["accepted_w"], g["via"]) for g in out["gpus"]] == [
        (1, 700.0, 450.0, "nvml"),
        (3, 700.0, 450.0, "nvml"),
    ]
    assert SimNvml(state).limits_w() == {
        0: 700.0,
        1: 450.0,
        2: 700.0,
        3: 450.0,
        4: 700.0,
        5: 700.0,
        6: 700.0,
        7: 700.0,
    }
    # the run dies here; the resumed run sets its next configuration's limit: the originals stay the true ones
    rc, out = limit(tmp_path, "--state", "set", "--limit", "300", "--gpus", "1,3")
    assert rc == 0 and {g["original_w"] for g in out["gpus"]} == {700.0}
    assert {g["accepted_w"] for g in out["gpus"]} == {300.0}
    record = json.loads((tmp_path / "gpu_power_limit.json").read_text())
    assert record["requested_w"] == 300 and {g["original_w"] for g in record["gpus"].values()} == {700.0}
    rc, shown = limit(tmp_path, "--state", "show", "--gpus", "1")  # read only
    assert rc == 0 and not shown["changed"] and shown["recorded"]["requested_w"] == 300
    assert [
        (g["limit_w"], g["default_w"], g["enforced_w"], g["min_w"], g["max_w"]) for g in shown["gpus"]
    ] == [(300.0, 700.0, 300.0, 200.0, 700.0)]
    rc, out = limit(tmp_path, "--state", "restored")
    assert rc == 0 and out["changed"] and {g["accepted_w"] for g in out["gpus"]} == {700.0}
    assert set(SimNvml(state).limits_w().values()) == {700.0}
    assert not (tmp_path / "gpu_power_limit.json").exists()
    rc, out = limit(tmp_path, "--state", "restored")  # nothing recorded: nothing to do
    assert rc == 0 and not out["changed"] and out["gpus"] == []


def test_refusals_say_why_and_leave_a_record_to_restore(tmp_path):
    rc, out = limit(tmp_path, "--state", "set", "--limit", "150")
    assert rc == 1 and "150 W is outside its allowed range 200-700 W" in out["error"]
    assert set(SimNvml(tmp_path / "sim_nvml.json").limits_w().values()) == {700.0}
    (tmp_path / "sim_nvml.json").write_text(json.dumps({"gpu": "H200", "deny_set": True}))
    rc, out = limit(tmp_path, "--state", "set", "--limit", "400")
    assert rc == 1 and "NVML refused 400 W: Insufficient Permissions" in out["error"]
    assert limit(tmp_path, "--state", "set", "--limit", "400", "--gpus", "9")[1]["error"] == (
        "no such GPU on this host: 9"
    )
    assert limit(tmp_path, "--state", "restored")[0] == 0  # the originals were recorded before any set


def prefill_decode(m: StepModel) -> tuple[float, float, float]:
    return m.prefill(1, 8192, 0, 8192 * 8192 / 2), m.decode(1, 3000), m.decode(64, 64 * 3000)


def test_the_limit_slows_compute_bound_prefill_by_the_clock_it_leaves_and_not_memory_bound_decode():
    rs = resolve_server({"model_path": "Qwen/Qwen3.6-27B", "tp_size": 1})
    m = StepModel(rs, calibration_for(rs))
    p = power_profile(rs.gpu.name)
    acct = m.track_power()
    pre0, d1, d64 = prefill_decode(m)
    assert acct[3] > 0, (
        "at the default limit a compute-bound prefill runs at the cap (the H200 measured so)"
    )
    slow = {}
    for watts in (600, 450, 300):
        m.set_power(p.cap_share(watts))
        acct[:] = [0.0] * 4
        pre = m.prefill(1, 8192, 0, 8192 * 8192 / 2)
        r = ((watts - p.idle_w) / (p.load_w - p.idle_w)) ** (1 / 3)
        assert acct[2] / acct[0] == pytest.approx(r, rel=0.02), "the clock ratio of a compute-bound step"
        assert acct[1] / acct[0] <= (watts - p.idle_w) / (p.load_w - p.idle_w) + 1e-9, "its power fits"
        slow[watts] = pre / pre0
        _, d1w, d64w = prefill_decode(m)
        assert d1w == pytest.approx(d1) and d64w == pytest.approx(d64, rel=0.01), "decode is memory-bound"
    assert 1.0 < slow[600] < slow[450] < slow[300] < 1.6, slow
    m.set_power(None)
    assert prefill_decode(m)[0] == pytest.approx(pre0)


def test_the_meter_follows_the_stand_ins_state_and_prices_power_by_the_steps_share(tmp_path):
    rs = resolve_server({"model_path": "Qwen/Qwen3.6-27B", "tp_size": 2})
    model = StepModel(rs, calibration_for(rs))
    now, busy = [0.0], [0.0]
    state = tmp_path / "sim_nvml.json"
    m = GpuMeter(
        "H200",
        2,
        lambda: busy[0],
        memory_total_bytes=1,
        memory_used_bytes=1,
        clock=lambda: now[0],
        model=model,
        nvml_state=state,
    )

    def run(seconds: float, step) -> dict:
        end = now[0] + seconds
        while now[0] < end:
            t = step()
            now[0] += t
            busy[0] += t
        return m.read()["gpus"][0]

    decode = run(2.0, lambda: model.decode(8, 8 * 2000))
    assert 120 < decode["power_w"] < 0.5 * 700, (
        "busy decode draws far below the cap (the H200 served at 280 W)"
    )
    assert decode["sm_clock_mhz"] == 1980 and not decode["throttle_reasons"] & 0x4
    prefill = run(3.0, lambda: model.prefill(1, 8192, 0, 8192 * 8192 / 2))
    assert prefill["power_w"] == pytest.approx(700, rel=0.02) and prefill["throttle_reasons"] & 0x4
    assert prefill["sm_clock_mhz"] == 1480
    nv = SimNvml(state, "H200")
    for i in (0, 1):
        nv.nvmlDeviceSetPowerManagementLimit(i, 300_000)
    m.sync_state()  # what the server's watcher thread does every 0.25 s
    capped = run(3.0, lambda: model.prefill(1, 8192, 0, 8192 * 8192 / 2))
    assert capped["power_limit_w"] == 300 and capped["power_w"] == pytest.approx(300, rel=0.02)
    assert capped["sm_clock_mhz"] == pytest.approx(1480 * (180 / 580) ** (1 / 3), abs=2)

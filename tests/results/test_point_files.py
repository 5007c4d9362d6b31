"""A point folder's gpu.json and clients.json as their models say (results/energy.py GpuFile, results/summary.py
ClientsFile; schema_version 1): files servesweep wrote before the models (an emulated point with a GPU sampler and
two Locust workers, one whose sampler did not answer, one local process) load whole, and the readers get their
figures; a damaged file is refused naming the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesweep.results.energy import GPU_JSON, load_gpu, save_gpu, summary_fields
from servesweep.results.summary import CLIENTS_JSON, ClientsFile, client_headroom

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

HERE = Path(__file__).parent
GPU_BEFORE = HERE / "gpu_v0_point.json"  # 2 emulated GPUs, a sampler at 4 Hz, 4 users for 3 s
GPU_SAMPLER_DOWN = HERE / "gpu_v0_sampler_down.json"  # the sampler's URL answered nothing: named, no figure
CLIENTS_WORKERS = HERE / "clients_v0_workers.json"  # a master and two local worker processes (--workers 2)
CLIENTS_LOCAL = HERE / "clients_v0_local.json"  # one local process


@pytest.mark.parametrize("before", [GPU_BEFORE, GPU_SAMPLER_DOWN], ids=["measured", "sampler-down"])
def test_a_gpu_json_written_before_the_model_loads_whole(tmp_path, before):
    raw = json.loads(before.read_text())
    shutil.copy(before, tmp_path / GPU_JSON)
    m = load_gpu(tmp_path)
    assert m is not None and m.as_data() == {"schema_version": 1, **raw}  # nothing lost, nothing added
    assert summary_fields(m.as_data()) == summary_fields(raw)  # what summary.json's "gpu" gets, unchanged
    if before is GPU_BEFORE:
        assert m.total is not None and m.total.gpus == len(m.gpus) == 2 and m.total.energy_j > 0
        assert {g.energy_source for g in m.gpus} == {"counter"} and not m.errors
    else:
        assert m.errors and m.errors[0].sampler == "http://127.0.0.1:9" and m.total and m.total.energy_j is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["gpus"][1].pop("energy_j"), "gpus.1.energy_j"),
        (lambda d: d["total"].update(throttled="maybe"), "total.throttled"),
        (lambda d: d["window"].update(extra=1), "window.extra"),
    ],
    ids=["gpu-missing", "wrong-type", "unknown-key"],
)
def test_a_damaged_gpu_json_is_named_with_its_field(tmp_path, change, field):
    raw = json.loads(GPU_BEFORE.read_text())
    change(raw)
    (tmp_path / GPU_JSON).write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        load_gpu(tmp_path)
    assert str(tmp_path / GPU_JSON) in str(e.value) and field in str(e.value)


def test_gpu_json_save_writes_the_version_and_refuses_what_its_load_would(tmp_path):
    assert load_gpu(tmp_path) is None  # no sampler ran: no file, no energy
    raw = json.loads(GPU_BEFORE.read_text())
    written = save_gpu(tmp_path, raw)
    assert json.loads((tmp_path / GPU_JSON).read_text()) == written and written["schema_version"] == 1
    raw["total"]["gpus"] = "two"
    with pytest.raises(ValueError, match="total.gpus"):
        save_gpu(tmp_path / "bad", raw)
    assert not (tmp_path / "bad" / GPU_JSON).exists()


@pytest.mark.parametrize("before", [CLIENTS_WORKERS, CLIENTS_LOCAL], ids=["workers", "local"])
def test_a_clients_json_written_before_the_model_loads_whole(tmp_path, before):
    raw = json.loads(before.read_text())
    shutil.copy(before, tmp_path / CLIENTS_JSON)
    m = ClientsFile.load(tmp_path / CLIENTS_JSON)
    assert m.as_data() == {"schema_version": 1, **raw}
    h = client_headroom(m.clients)
    senders = sorted(c["worker"] for c in raw["clients"] if c.get("role") != "master")
    assert [w["worker"] for w in h["workers"]] == senders
    if before is CLIENTS_WORKERS:
        assert m.worker_exits == {int(pid): 0 for pid in raw["worker_exits"]} and len(m.worker_exits) == 2
        assert h["master"]["worker"].startswith("master ") and {w["role"] for w in h["workers"]} == {"worker"}
    else:
        assert [w["role"] for w in h["workers"]] == ["local"] and h["workers"][0]["cpu_pct"] > 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["clients"][0].pop("client_id"), "clients.0.client_id"),
        (lambda d: d["clients"][2].update(cpu_s="fast"), "clients.2.cpu_s"),
        (lambda d: d.update(worker_exits={"pid": 0}), "worker_exits.pid"),
    ],
    ids=["missing", "wrong-type", "bad-pid"],
)
def test_a_damaged_clients_json_is_named_with_its_field(tmp_path, change, field):
    raw = json.loads(CLIENTS_WORKERS.read_text())
    change(raw)
    (tmp_path / CLIENTS_JSON).write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        ClientsFile.load(tmp_path / CLIENTS_JSON)
    assert str(tmp_path / CLIENTS_JSON) in str(e.value) and field in str(e.value)


def test_compare_reads_a_points_energy_through_the_model_and_names_a_damaged_gpu_json(tmp_path):
    from servesweep.results.compare import point_energy
    from servesweep.results.runfolder import PointInfo, RunError

    point = PointInfo("c4", "", "chat", 200, 32, 4, "done", dir=tmp_path)
    assert point_energy(point) is None  # no sampler ran
    raw = json.loads(GPU_BEFORE.read_text())
    shutil.copy(GPU_BEFORE, tmp_path / GPU_JSON)
    assert point_energy(point) == {**raw["total"], "tokens_per_joule": raw["total"].get("tokens_per_joule")}
    raw["total"]["energy_j"] = "lots"
    (tmp_path / GPU_JSON).write_text(json.dumps(raw))
    with pytest.raises(RunError) as e:  # before the model: returned as it was, a string where a figure goes
        point_energy(point)
    assert str(tmp_path / GPU_JSON) in str(e.value) and "total.energy_j" in str(e.value)

"""`servesweep plan` packs the matrix onto the GPUs of its inventory: the field's 8-GPU example shows a timeline per
host and GPU and a wall time well under the serial one; hosts, GPU counts and NVLink halves come from the
inventory's host variables; `parallel: false` and `--max-parallel` hold."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from servesweep.cli.plan import command as plan_command

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen36-27b-rtxpro6000.yaml"


def _plan(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(plan_command, list(args))
    return r.exit_code, r.output


def _no_overlap(placements: list[dict]) -> None:
    for a, b in itertools.combinations(placements, 2):
        if a["host"] == b["host"] and set(a["gpus"]) & set(b["gpus"]):
            assert a["end_s"] <= b["start_s"] or b["end_s"] <= a["start_s"], (a, b)


def _variant(tmp_path: Path, **changes) -> Path:
    d = yaml.safe_load(EXAMPLE.read_text())
    for k, v in changes.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.mark.fast
def test_the_8_gpu_example_plans_packed_well_under_serial():
    code, out = _plan(str(EXAMPLE), "--json")
    assert code == 0, out
    j = json.loads(out)
    packed = j["packed"]
    assert packed["serial_s"] == j["total_s"]
    assert packed["wall_s"] < 0.5 * j["total_s"]
    assert {p["config"] for p in packed["placements"]} == {c["id"] for c in j["configs"] if c["feasible"]}
    _no_overlap(packed["placements"])
    for p in packed["placements"]:
        tp = next(c for c in j["configs"] if c["id"] == p["config"])["flags"]["tp_size"]
        assert len(p["gpus"]) == tp
        assert p["cuda_visible_devices"] == ",".join(map(str, p["gpus"]))
    code, text = _plan(str(EXAMPLE))
    assert code == 0
    assert "packed onto 1 host(s), 8 emulated RTX PRO 6000 Blackwell GPUs" in " ".join(text.split())
    assert f"{packed['wall_s'] / 3600:.2f}h against {j['total_s'] / 3600:.2f}h" in text
    rows = [line for line in text.splitlines() if "|" in line and line.rstrip().endswith("|")]
    assert len(rows) == 8  # one row per GPU


def test_hosts_gpus_and_halves_come_from_the_inventory(tmp_path):
    (tmp_path / "inv.ini").write_text(
        "[gpu]\n"
        "g1 ansible_host=10.9.0.1 gpus=8 gpu_groups='[[0,1,2,3],[4,5,6,7]]'\n"
        "g2 ansible_host=10.9.0.2 gpus=8 gpu_groups='[[0,1,2,3],[4,5,6,7]]'\n"
        "[gpu:vars]\nansible_connection=local\n"
    )
    exp = _variant(tmp_path, target={"inventory": "inv.ini", "port": 31000})
    code, out = _plan(str(exp), "--json")
    assert code == 0, out
    packed = json.loads(out)["packed"]
    assert [h["name"] for h in packed["hosts"]] == ["g1", "g2"]
    assert {p["host"] for p in packed["placements"]} == {"g1", "g2"}
    _no_overlap(packed["placements"])
    for p in packed["placements"]:
        if len(p["gpus"]) == 4:
            assert p["gpus"] in ([0, 1, 2, 3], [4, 5, 6, 7])
    one_host = json.loads(_plan(str(EXAMPLE), "--json")[1])["packed"]["wall_s"]
    assert packed["wall_s"] < 0.7 * one_host
    assert len({p["port"] for p in packed["placements"]}) == len(packed["placements"])
    assert packed["placements"][0]["port"] == 31000


@pytest.mark.fast
def test_parallel_false_and_max_parallel(tmp_path):
    serial = json.loads(_plan(str(_variant(tmp_path, parallel=False)), "--json")[1])["packed"]
    _no_overlap(serial["placements"])
    spans = sorted((p["start_s"], p["end_s"]) for p in serial["placements"])
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # one server at a time
    two = json.loads(_plan(str(EXAMPLE), "--json", "--max-parallel", "2")[1])["packed"]
    assert two["max_parallel"] == 2
    for t in {p["start_s"] for p in two["placements"]}:
        assert sum(1 for p in two["placements"] if p["start_s"] <= t < p["end_s"]) <= 2


@pytest.mark.fast
def test_the_quickstart_plan_says_its_gpus_are_emulated_and_its_ports_chosen_at_start():
    """The demo's first screen (issue 34 item 9): on a machine with no GPU the packing chart's GPUs are the
    emulator's declared ones, `port: 0` shows no made-up port numbers, and a memory fit that drops nothing is the
    plan's memory line, not a pitfall of 0 points."""
    code, text = _plan(str(EXAMPLE.with_name("quickstart.yaml")))
    assert code == 0, text
    flat = " ".join(text.split())
    assert "packed onto 1 host(s), 8 emulated H200 GPUs" in flat
    legend = [line for line in text.splitlines() if line[:2] in ("A ", "B ")]
    assert len(legend) == 2 and all(
        "a free port at start" in line and "port 3" not in line for line in legend
    )
    assert "memory: hybrid model" in flat and "Every concurrency × context point fits" in flat
    assert "kv_state_memory (0 points)" not in flat and "pitfalls (" not in flat
    # its 4 requests per point: said to be a smoke test, not tails
    assert "load.requests is 4: a p99 of 4 requests is their slowest one, so these points are a smoke test" in flat

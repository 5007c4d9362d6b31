"""The field's search variants (examples/*-search.yaml): planned with a start estimate and fewer probes than the
grid, and dry-run on the emulator: the A6000 one end to end (the capacity-at-SLO table with tok/s per GPU, the
frontier plot, --resume replaying finished probes, the gate on a minimum capacity and compare), the RTX PRO 6000
one cut to one of its six configurations (the whole matrix takes minutes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import run_servesweep

from servesweep.cli.plan import command as plan_command
from servesweep.config.experiment import ExperimentError, parse_experiment

ROOT = Path(__file__).resolve().parents[2]
A6000 = ROOT / "examples" / "qwen36-27b-a6000-tp2-search.yaml"
RTX = ROOT / "examples" / "qwen36-27b-rtxpro6000-search.yaml"


def _cli(*args: str, timeout: int = 400) -> tuple[int, str]:
    return run_servesweep(*args, timeout=timeout)


@pytest.mark.fast
@pytest.mark.parametrize("path", [A6000, RTX], ids=["a6000", "rtxpro6000"])
def test_search_examples_plan_a_start_and_fewer_probes_than_the_grid(path):
    r = CliRunner().invoke(plan_command, [str(path), "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    exp = parse_experiment(path.read_text())
    searches = [p["search"] for c in plan["configs"] for p in c["points"] if p["feasible"]]
    assert searches and all(s is not None for s in searches)
    for s in searches:
        assert exp.search.lower <= s["start"] <= exp.search.upper
        assert set(s["predicted_capacity"]) == set(exp.search.tiers)
        assert 1 <= s["probes"] <= s["grid_points"] / 2 and s["calls"] >= s["probes"] and s["seconds"] > 0


@pytest.mark.fast
def test_search_block_errors_name_their_line():
    text = A6000.read_text()
    bad = text.replace("decode_tokens_per_s_p50>=30,", "decode_tokens_per_s_p42>=30,")
    with pytest.raises(ExperimentError) as e:
        parse_experiment(bad, "x.yaml")
    line = next(i + 1 for i, s in enumerate(bad.splitlines()) if s.strip().startswith("tiers:"))
    assert f"x.yaml:{line}: search.tiers: tier interactive" in str(e.value) and "p42" in str(e.value)
    both = text.replace("  prompt_tokens: 1000\n", "  prompt_tokens: 1000\n  concurrency: [1, 8]\n")
    with pytest.raises(ExperimentError, match="load.concurrency: search.axis concurrency searches it"):
        parse_experiment(both)


def _cut_to_one_configuration(src: Path, dst: Path, tp_size: int, bundle: str) -> None:
    """`src` with one tp_size and one bundle left: one server configuration, its search block as it is."""
    from ruamel.yaml import YAML

    yaml = YAML()
    d = yaml.load(src.read_text())
    d["server"]["axes"]["tp_size"] = [tp_size]
    d["server"]["bundles"] = [b for b in d["server"]["bundles"] if b["name"] == bundle]
    with dst.open("w") as f:
        yaml.dump(d, f)


def test_rtxpro6000_search_dry_run_one_configuration_prints_capacity_per_gpu_and_the_frontier(tmp_path):
    # TP8 with DFLASH: the per-GPU figures divide by 8, and its probes settle in few calls (~45 s here; TP8
    # autoregressive took ~70 s, its per-user speed closer to the tiers' thresholds needs more top-ups)
    exp = tmp_path / "rtxpro6000-tp8-dflash-search.yaml"
    _cut_to_one_configuration(RTX, exp, 8, "dflash")
    out = tmp_path / "runs"
    rc, text = _cli("run", str(exp), "--dry-run", "--out", str(out), timeout=200)
    assert rc == 0, text[-5000:]
    assert "capacity at SLO" in text and "tok/s/GPU" in text and "req/s/GPU" in text
    run_dir = next(out.iterdir())
    svg = (run_dir / "frontier.svg").read_text()
    assert svg.startswith("<svg") and "Pareto frontier" in svg
    cap = json.loads((run_dir / "capacity.json").read_text())
    rows = cap["rows"]
    assert {r["tier"] for r in rows} == {"tier1", "tier2", "tier3"} and {r["config"] for r in rows} == {"s01"}
    found = [r for r in rows if r["capacity"] is not None]
    assert found, rows  # the scaled tiers are the example's: at least tier 1 holds at some concurrency
    for r in found:
        a = r["at_capacity"]
        assert r["gpus"] == 8 and r["stop"] == "resolution"
        lo, hi = r["bracket"]
        assert lo == r["capacity"] and hi - lo <= max(1, 0.05 * lo)  # the stated resolution
        assert a["output_tokens_per_s_per_gpu"] == pytest.approx(a["output_tokens_per_s"] / 8)
        assert a["request_rate_per_gpu"] == pytest.approx(a["request_rate"] / 8)
    assert any(p["pareto"] for p in cap["frontier"])
    assert cap["probes"] <= cap["grid_points"] / 2


def _interrupt_last_probe(run_dir: Path) -> list[str]:
    """As a run killed during its last probe load leaves it: those points gone, the search running."""
    m = json.loads((run_dir / "manifest.json").read_text())
    last = max(m["points"].values(), key=lambda p: p["started"])["load"]
    gone = [pid for pid, p in m["points"].items() if p["load"] == last]
    for pid in gone:
        shutil.rmtree(run_dir / pid)
        del m["points"][pid]
    for s in m["searches"].values():
        s.update(status="running", result=None)
    m["status"] = "interrupted"
    (run_dir / "manifest.json").write_text(json.dumps(m))
    (run_dir / "capacity.json").unlink()
    return gone


def test_a6000_search_dry_run_prints_capacity_per_gpu_writes_the_frontier_and_resumes(tmp_path):
    out = tmp_path / "runs"
    rc, text = _cli("run", str(A6000), "--dry-run", "--out", str(out))
    assert rc == 0, text[-5000:]
    assert "capacity at SLO" in text and "tok/s/GPU" in text and "req/s/GPU" in text
    run_dir = next(out.iterdir())
    svg = (run_dir / "frontier.svg").read_text()
    assert svg.startswith("<svg") and "Pareto frontier" in svg
    cap = json.loads((run_dir / "capacity.json").read_text())
    assert {r["tier"] for r in cap["rows"]} == {"interactive", "fast"}
    for r in cap["rows"]:
        a = r["at_capacity"]
        assert r["gpus"] == 2 and r["capacity"] is not None and r["stop"] == "resolution"
        lo, hi = r["bracket"]
        assert lo == r["capacity"] and hi - lo <= max(1, 0.05 * lo)  # the stated resolution
        assert a["output_tokens_per_s_per_gpu"] == pytest.approx(a["output_tokens_per_s"] / 2)
    assert any(p["pareto"] for p in cap["frontier"])
    assert cap["probes"] <= cap["grid_points"] / 2
    assert "Capacity at SLO" in (run_dir / "report.md").read_text()

    # the gate: the capacity found passes, one above it fails; compare matches the run with itself
    need = min(r["capacity"] for r in cap["rows"])
    assert _cli("gate", str(run_dir), "--min-capacity", str(need))[0] == 0
    rc, gate_out = _cli("gate", str(run_dir), "--min-capacity", str(need + 50))
    assert rc == 1 and "BREACH" in gate_out
    rc, cmp_out = _cli("compare", str(run_dir), str(run_dir))
    assert rc == 0 and "same within resolution" in cmp_out

    # resume after a kill during the last probe load: the earlier probes are read back, not measured again
    kept = json.loads((run_dir / "manifest.json").read_text())["points"]
    gone = _interrupt_last_probe(run_dir)
    rc, text = _cli("run", "--resume", str(run_dir))
    assert rc == 0, text[-5000:]
    m = json.loads((run_dir / "manifest.json").read_text())
    replayed = [pid for pid in kept if pid not in gone]
    assert all(f"↺ {pid}: finished before, read back" in text for pid in replayed)
    assert all(
        m["points"][pid]["attempts"] == 1 and m["points"][pid]["finished"] == kept[pid]["finished"]
        for pid in replayed
    )
    first = next(p for p in gone if p.endswith("-n1"))  # the load probed again, from its first call
    assert m["points"][first]["status"] == "done" and m["points"][first]["attempts"] == 1
    assert all(s["status"] == "done" for s in m["searches"].values())
    assert {r["tier"] for r in json.loads((run_dir / "capacity.json").read_text())["rows"]} == {
        "interactive",
        "fast",
    }

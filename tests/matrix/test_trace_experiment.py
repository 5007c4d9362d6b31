"""A trace replay in an experiment (issue 30): examples/qwen36-27b-a6000-tp2-trace.yaml, the seed-B system
replaying a generated Mooncake trace with a search over its speed-up (the replay capacity), parsed, planned and
dry-run on the emulator: the capacity table's row is a speed-up of the trace (and per GPU), every probe replayed the
whole window with its fidelity verdict in its summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import run_servesweep

from servesweep.config.experiment import ExperimentError, load_experiment, parse_experiment
from servesweep.results.capacity import table_rows

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen36-27b-a6000-tp2-trace.yaml"
TRACE = ROOT / "examples" / "traces" / "mooncake-synth-64.jsonl"

@pytest.mark.fast
def test_the_trace_example_parses_with_its_trace_next_to_it_and_plans_a_speedup_search():
    from servesweep.cli.plan import command as plan_command

    exp = load_experiment(EXAMPLE)
    fields = exp.load.workload_fields("production")
    assert fields["workload"] == "trace" and Path(fields["trace"]) == TRACE.resolve()
    assert exp.search is not None and exp.search.axis == "speedup"
    cfg = exp.server_configs()[0][0]
    (pt,) = exp.points_for(cfg)[0]
    assert pt.id.endswith("-c32-x0.25"), pt.id
    r = CliRunner().invoke(plan_command, [str(EXAMPLE), "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert [p["search"] is not None for c in plan["configs"] for p in c["points"]] == [True]


@pytest.mark.fast
def test_a_speedup_search_needs_trace_workloads_and_no_warmup():
    text = EXAMPLE.read_text()
    with pytest.raises(
        ExperimentError, match="search.axis speedup replays traces: workload 'single' is not one"
    ):
        parse_experiment(text.replace("  workload: production\n", "  workload: single\n"))
    with pytest.raises(ExperimentError, match="measures every request of its trace window: warmup_s 0"):
        parse_experiment(text.replace("  requests: 64 ", "  warmup_s: 5\n  requests: 64 "))


def test_the_trace_example_dry_run_finds_a_replay_capacity(tmp_path):
    out = tmp_path / "runs"
    rc, text = run_servesweep("run", str(EXAMPLE), "--dry-run", "--out", str(out), timeout=400)
    assert rc == 0, text[-5000:]
    run_dir = next(out.iterdir())
    cap = json.loads((run_dir / "capacity.json").read_text())
    assert cap["axis"] == "speedup"
    (row,) = cap["rows"]
    assert row["load_unit"] == "x trace" and row["capacity"] is not None, row
    assert "capacity at SLO (speedup)" in text
    assert table_rows(cap)[0][6].endswith("×/GPU)")  # the table: the trace's speed-up, and per GPU
    summaries = [json.loads(f.read_text()) for f in run_dir.glob("*/summary.json")]
    assert summaries
    for s in summaries:
        f = s["trace_fidelity"]
        assert f["faithful"] and f["requests_sent"] == f["requests_trace"] == 64 and f["cache_flushed"], f
        assert s["point"]["trace_speedup"] >= 5 and s["requests"]["ok"] == 64  # the dry run's speed-ups: 20x


@pytest.mark.fast
def test_the_planner_prices_a_replay_from_its_window():
    from servesweep.cli.plan import command as plan_command

    r = CliRunner().invoke(plan_command, [str(EXAMPLE), "--json"])
    assert r.exit_code == 0, r.output
    (p,) = [p for c in json.loads(r.output)["configs"] for p in c["points"]]
    rp = p["estimate"]["replay"]
    assert (rp["requests"], rp["duration_s"], rp["rate_rps"]) == (64, 63.0, 1.0)
    assert round(rp["prompt_mean"]) == 1805 and rp["output_mean"] == 200 and rp["kv_tokens"] > 0
    # the search is priced as an open loop at the trace's mean rate times the speed-up: a capacity inside the bounds
    cap = p["search"]["predicted_capacity"]["interactive"]
    assert cap is None or 0.25 <= cap <= 8

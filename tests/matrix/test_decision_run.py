"""`servesweep run` on an experiment with a `decide:` block, on the emulator through the Ansible role: the decision's
probes are real points (Locust against the emulator), the answer is decision.json, the report has its section.

Two configurations differ only by their step time (`--sim-calibration` speedup 20 against 10, with per_seq_s = 0.1:
each running sequence adds 5 ms, resp. 10 ms, to every step), so the slow one holds each decode-speed tier at about
half the concurrency and serves about half the tok/s per GPU. The expected answer is the step model's exhaustive
one (matrix/decision.py `exhaustive` over the planner's cells, which take each configuration's --sim-calibration),
not a name written here."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from support import emulator_experiment_head, run_servesweep

from servesweep.config.experiment import load_experiment
from servesweep.matrix.capacity_search import parse_tier
from servesweep.matrix.decision import Noise, capacity, exhaustive
from servesweep.matrix.planner import decision_cells, make_plan

BODY = """\
  bundles:
    - {name: fast, flags: {sim_calibration: "per_seq_s=0.1,speedup=20"}}
    - {name: slow, flags: {sim_calibration: "per_seq_s=0.1,speedup=10"}}
load: {endpoint: chat, prompt_tokens: 64, output_tokens: 16, concurrency: [1, 2, 4, 8], requests: 8}
decide:
  tiers:
    fast: [tpot_p50<=20ms]
    relaxed: [tpot_p50<=40ms]
  confidence: 90%
  resolution: 10%
  max_requests: 64
  max_looks: 2
  prior_margin: 10      # rely on measurements: each configuration is probed
"""


def _experiment(tmp: Path, name: str, extra: str = "") -> Path:
    head = emulator_experiment_head(tmp, name).replace(
        "sim_args: {sim_load_time: 0.2}",
        'sim_args: {sim_load_time: 0.2, sim_calibration: "per_seq_s=0.1,speedup=20"}',
    )
    f = tmp / f"{name}.yaml"
    f.write_text(head + BODY + extra)
    return f


def _truth(exp_file: Path) -> tuple[dict, dict]:
    """The step model's exhaustive answer: best configuration and capacity per (shape, tier)."""
    exp = load_experiment(str(exp_file))
    assert exp.decide is not None
    cells = decision_cells(make_plan(exp))
    values = exhaustive(cells, exp.decide.tiers, Noise())
    best = {q: max(v, key=lambda k: v[k]) for q, v in values.items()}
    caps = {
        (c.config, c.shape.key, t): capacity(c, parse_tier(texts), Noise())
        for c in cells
        for t, texts in exp.decide.tiers.items()
    }
    return best, caps


@pytest.mark.timeout(240)
def test_decide_run_names_the_step_models_best_configuration(tmp_path):
    exp = _experiment(tmp_path, "decide-two")
    # with a first-token bound no probe here comes near (64-token prompts): each probe above load 1 skips its
    # opening burst
    text = exp.read_text().replace("decide:\n", "decide:\n  skip_first_round: true\n")
    exp.write_text(text.replace("tpot_p50<=20ms]", "tpot_p50<=20ms, ttft_p95<=5s]").replace(
        "tpot_p50<=40ms]", "tpot_p50<=40ms, ttft_p95<=5s]"))
    rc, out = run_servesweep("run", str(exp), "--out", str(tmp_path / "runs"), timeout=200)
    assert rc == 0, out[-5000:]
    run_dir = next((tmp_path / "runs").iterdir())
    doc = json.loads((run_dir / "decision.json").read_text())
    best, caps = _truth(exp)
    assert doc["status"] == "finished" and doc["complete"] and doc["label"].startswith("final answer"), doc[
        "label"
    ]
    assert {(q["shape"], q["tier"]) for q in doc["questions"]} == set(best)
    for q in doc["questions"]:
        assert q["state"] == "decided", q
        # how many probes measured the answer's own cell (0: it rests on the configuration's other cells or the
        # step model)
        assert q["best_cell_probes"] == sum(
            1 for r in doc["probe_log"] if (r["config"], r["shape"]) == (q["best"], q["shape"])
        ), q
        assert q["best"] == best[(q["shape"], q["tier"])], (q, best)
        v = q["value"]
        assert v["low"] <= v["estimate"] <= v["high"], v
        # the measured capacity bracket holds the step model's capacity, one step either way (a near-threshold
        # verdict is decided by its estimate); no upper end: the winner was not seen failing (decided on its
        # calibrated bound)
        lo, hi = v["bracket"]
        cap = caps[(q["best"], q["shape"], q["tier"])]
        assert lo - 1 <= cap and (hi is None or cap <= hi + 1), (q, cap)
    print(f"\n{doc['label']}; {doc['gpu_seconds']} GPU-s, {doc['elapsed_s']} s")
    # every probe is a point of the manifest with its folder and summary; each server started once
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["decision"]["status"] == "finished" and m["decision"]["probes"] == doc["probes"] >= 2
    logged = [pid for r in doc["probe_log"] for pid in r["points"]]
    assert sorted(logged) == sorted(m["points"])
    for pid, p in m["points"].items():
        assert p["status"] == "done" and p["decide"] and p["look"] >= 1, (pid, p)
        assert (run_dir / pid / "summary.json").is_file()
    # skip_first_round: above load 1 each look ran its users' first requests on top of those judged
    for r in doc["probe_log"]:
        asked = sum(m["points"][pid]["asked"] for pid in r["points"])
        extra = r["load"] * len(r["points"]) if r["load"] > 1 else 0
        assert asked == r["requests"] + extra and r["first_round_skipped"] == extra, (r, asked)
    assert any(r["load"] > 1 for r in doc["probe_log"]), doc["probe_log"]
    assert {r["config"] for r in doc["probe_log"]} == {"s01-fast", "s02-slow"}
    assert all(c.get("restarts", 0) == 0 for c in m["configs"].values()), m["configs"]
    # packed (the default, as `servesweep plan` prices it): each configuration's server on a GPU of its own, both up
    # at once, each probe measured on its lane's server (its address and GPU in the point), every server stopped
    assert m["decision"]["packed"] is True
    lanes = {ln["config"]: ln for ln in doc["lanes"]}
    assert set(lanes) == {"s01-fast", "s02-slow"} and lanes["s01-fast"]["gpus"] != lanes["s02-slow"]["gpus"]
    placements = {pl["config"]: pl for pl in m["packing"]["placements"]}
    assert placements["s01-fast"]["port"] != placements["s02-slow"]["port"]
    first = {}
    for p in m["points"].values():
        pl = placements[p["config_id"]]
        assert (
            p["point"]["base_url"].endswith(f":{pl['port']}") and p["point"]["labels"]["gpus"] == pl["gpus"]
        )
        first.setdefault(p["config_id"], (p["started"], p["finished"]))
    (a0, a1), (b0, b1) = first["s01-fast"], first["s02-slow"]
    assert a0 < b1 and b0 < a1, first  # the two configurations' first probes ran at the same time
    assert all(c["server_stopped"] for c in m["configs"].values()), m["configs"]
    assert "decision: probe 1 " in out  # the one-line progress after each probe
    md = (run_dir / "report.md").read_text()
    assert "## Decision" in md and doc["label"] in md
    assert 'id="decision-table"' in (run_dir / "report.html").read_text()


@pytest.mark.timeout(240)
def test_budget_stops_with_best_so_far_and_resume_reads_back_its_probes(tmp_path):
    # one server at a time (--max-parallel 1): one probe in flight when the budget stops it
    exp = _experiment(tmp_path, "decide-budget", "budget: {wall_time: 1s}\n")
    rc, out = run_servesweep(
        "run", str(exp), "--out", str(tmp_path / "runs"), "--max-parallel", "1", timeout=120
    )
    assert rc == 2, out[-5000:]
    assert "budget.wall_time" in out
    run_dir = next((tmp_path / "runs").iterdir())
    doc = json.loads((run_dir / "decision.json").read_text())
    assert doc["status"] == "budget" and not doc["complete"], doc
    assert doc["label"].startswith("best so far"), doc["label"]
    assert doc["probes"] == 1
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["decision"]["status"] == "budget"
    (first,) = m["points"]
    finished = m["points"][first]["finished"]
    assert "## Decision" in (run_dir / "report.md").read_text()

    # a resume reads the measured probe back (not measured again) and goes on for another budget: one more probe
    # measured, then the budget stops it (exit 2) or the decision is settled (exit 0)
    rc, out = run_servesweep("run", "--resume", str(run_dir), timeout=120)
    assert f"↺ {first}: finished before, read back" in out
    doc = json.loads((run_dir / "decision.json").read_text())
    m = json.loads((run_dir / "manifest.json").read_text())
    assert doc["probes"] == 2 and doc["status"] in ("budget", "finished"), doc["label"]
    assert rc == (0 if doc["status"] == "finished" else 2), out[-5000:]
    assert m["points"][first]["finished"] == finished and m["points"][first]["attempts"] == 1
    assert sorted(m["points"]) == sorted(pid for r in doc["probe_log"] for pid in r["points"])


@pytest.mark.timeout(240)
def test_a_packed_decision_at_its_budget_lets_the_probes_in_flight_finish_and_stops_every_lane(tmp_path):
    """budget.wall_time while both lanes probe: no new probe starts, the two in flight finish and count, both lanes'
    servers are stopped, decision.json says best so far (budget) with both lanes, exit 2."""
    from test_packed_kills import _servers_alive

    exp = _experiment(tmp_path, "decide-packed-budget", "budget: {wall_time: 1s}\n")
    rc, out = run_servesweep("run", str(exp), "--out", str(tmp_path / "runs"), timeout=120)
    assert rc == 2, out[-5000:]
    run_dir = next((tmp_path / "runs").iterdir())
    doc = json.loads((run_dir / "decision.json").read_text())
    m = json.loads((run_dir / "manifest.json").read_text())
    assert doc["status"] == "budget" and doc["label"].startswith("best so far"), doc["label"]
    assert {r["config"] for r in doc["probe_log"]} == {"s01-fast", "s02-slow"} and doc["probes"] == 2
    assert all(ln["closed_s"] is not None and ln["probes"] == 1 for ln in doc["lanes"]), doc["lanes"]
    assert all(p["status"] == "done" for p in m["points"].values()), m["points"]
    assert all(c["server_stopped"] for c in m["configs"].values()), m["configs"]
    assert _servers_alive(tmp_path / "srv") == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "one-server"])
def test_a_server_that_does_not_start_stops_the_decision_with_its_answer_so_far(tmp_path, packed):
    """One configuration's emulator refuses its --sim-calibration at start: the decision stops when it must probe
    it, exit 2, decision.json says failed with the answer so far, the manifest says why. Packed, the other
    configuration's probe in flight finishes and counts (nothing measured is lost)."""
    exp = _experiment(tmp_path, "decide-broken")
    exp.write_text(exp.read_text().replace('speedup=10"}', 'no_such_key=1"}'))
    args = [] if packed else ["--max-parallel", "1"]
    rc, out = run_servesweep("run", str(exp), "--out", str(tmp_path / "runs"), *args, timeout=120)
    assert rc == 2, out[-5000:]
    run_dir = next((tmp_path / "runs").iterdir())
    doc = json.loads((run_dir / "decision.json").read_text())
    m = json.loads((run_dir / "manifest.json").read_text())
    assert doc["status"] == "failed" and not doc["complete"], doc["label"]
    assert m["decision"]["status"] == "failed" and "s02-slow did not start" in m["decision"]["reason"]
    assert m["configs"]["s02-slow"]["status"] == "failed"
    slow = [p for p in m["points"].values() if p["config_id"] == "s02-slow"]
    if packed:  # the server failed before its first probe's point was made
        assert slow == [] and doc["probes"] >= 1
        assert all(p["status"] == "done" for p in m["points"].values()), m["points"]
        assert m["configs"]["s01-fast"]["server_stopped"] is True
    else:
        (probe,) = slow
        assert probe["status"] == "server_failed" and "did not start" in probe["reason"]
    assert all(r["config"] == "s01-fast" for r in doc["probe_log"])
    assert "## Decision" in (run_dir / "report.md").read_text()


@pytest.mark.timeout(300)
def test_sigterm_stops_every_lanes_server_and_resume_finishes_the_decision(tmp_path):
    """A packed decision stopped by SIGTERM while both lanes stream: exit 143, every lane's server stopped (not only
    one), the probes finished before kept; `--resume` stops nothing it did not start, reads them back and finishes
    with the step model's answer, no server left."""
    from test_packed_kills import _servers_alive
    from test_reliability_server import cleanup, manifest, run_dir_of, start

    exp = _experiment(tmp_path, "decide-sigterm")
    exp.write_text(exp.read_text().replace("output_tokens: 16", "output_tokens: 64"))
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    proc = start(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log")
    run_dir = None
    try:
        deadline = time.monotonic() + 150
        while proc.poll() is None and time.monotonic() < deadline:
            run_dir = run_dir_of(runs)
            m = manifest(run_dir) if run_dir else None
            if m and len({p["config_id"] for p in m["points"].values() if p["status"] == "running"}) >= 2:
                break
            time.sleep(0.05)
        else:
            log = (tmp_path / "run.log").read_text()[-3000:]
            raise AssertionError(f"the two lanes never streamed at the same time: {log}")
        assert len(_servers_alive(srv)) == 2
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=120)
        out = (tmp_path / "run.log").read_text()
        assert rc == 128 + signal.SIGTERM, out[-3000:]
        assert "stopped the servers of 2 of 2 placement(s)" in out, out[-3000:]
        assert _servers_alive(srv) == [], "a lane's server outlived the SIGTERM"
        m = manifest(run_dir)
        assert m["status"] == "interrupted" and "running" not in {p["status"] for p in m["points"].values()}
        done = {pid: p["finished"] for pid, p in m["points"].items() if p["status"] == "done"}
        proc = start(["run", "--resume", str(run_dir)], tmp_path, tmp_path / "resume.log")
        rc = proc.wait(timeout=200)
        out = (tmp_path / "resume.log").read_text()
        assert rc == 0, out[-3000:]
        if done:  # the resumed decision starts as the first did: its first probes are read back, not measured
            assert any(f"↺ {pid}: finished before, read back" in out for pid in done), out[-3000:]
        m = manifest(run_dir)
        doc = json.loads((run_dir / "decision.json").read_text())
        assert doc["status"] == "finished" and m["decision"]["status"] == "finished"
        for pid, finished in done.items():  # nothing measured twice
            assert m["points"][pid]["finished"] == finished and m["points"][pid]["attempts"] == 1
        best, _ = _truth(exp)
        assert {(q["shape"], q["tier"]): q["best"] for q in doc["questions"]} == best
        assert _servers_alive(srv) == []
    finally:
        cleanup(proc, run_dir, srv)


@pytest.mark.timeout(240)
def test_one_users_stream_of_the_short_output_judges_the_long_one_at_load_1(tmp_path):
    """Two output lengths; a tier the slow configuration holds only alone on the server: its load-1 cells of both
    outputs are judged on one stream of 16-token answers (a real point each look), the 64-token cell's record says
    `measured_as` and lists those points, no 64-token point runs at load 1 for it, and the answer is the step
    model's exhaustive one."""
    exp = _experiment(tmp_path, "decide-one-user")
    text = exp.read_text().replace("output_tokens: 16", "output_tokens: [16, 64]")
    text = text.replace("fast: [tpot_p50<=20ms]\n    relaxed: [tpot_p50<=40ms]", "one: [tpot_p50<=15ms]")
    exp.write_text(text.replace("decide:\n", "decide:\n  share_one_user: true\n"))
    rc, out = run_servesweep("run", str(exp), "--out", str(tmp_path / "runs"), "--max-parallel", "1", timeout=200)
    assert rc == 0, out[-5000:]
    run_dir = next((tmp_path / "runs").iterdir())
    doc = json.loads((run_dir / "decision.json").read_text())
    best, caps = _truth(exp)
    assert caps[("s02-slow", "chat-p64-o64", "one")] == 1  # the step model's: alone on the server only
    assert {(q["shape"], q["tier"]): q["best"] for q in doc["questions"]} == best, doc["questions"]
    shared = [r for r in doc["probe_log"] if r["measured_as"] not in (None, r["shape"])]
    assert shared, doc["probe_log"]
    m = json.loads((run_dir / "manifest.json").read_text())
    for r in shared:
        assert r["load"] == 1 and r["measured_as"] == "chat-p64-o16" and r["shape"] == "chat-p64-o64", r
        assert r["points"] and all(m["points"][pid]["output_tokens"] == 16 for pid in r["points"]), r
        # its verdict from the 16-token stream: measured TPOT times the model's ratio, here about 1 (64 tokens of
        # context more): the same verdict as the 16-token cell's own load-1 probe where that one was made
        own = [x for x in doc["probe_log"] if (x["config"], x["shape"], x["load"]) == (r["config"], "chat-p64-o16", 1)]
        for x in own:
            assert x["verdicts"] == r["verdicts"] and x["points"] == r["points"], (x, r)
        assert not [
            p for p in m["points"].values()
            if p["config_id"] == r["config"] and p["output_tokens"] == 64 and p["concurrency"] == 1
        ]  # fmt: skip
    assert "measured as chat-p64-o16" in out
    assert set(m["points"]) == {pid for r in doc["probe_log"] for pid in r["points"]}

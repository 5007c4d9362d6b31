"""What the decision's two cheapening levers save on the field's question (issue 33): the plan of
examples/qwen36-27b-rtxpro6000-decide.yaml with one user's load-1 stream shared by a prompt's output lengths and the
loads above each cell's throughput knee left unsearched (the example's settings; the knee is the default, the shared
stream an opt-in), against both off (the decision of
2026-12-04, 2.51 h: over the 2-hour budget). Two plans of ~10 s each: kept out of the fast tier."""

from __future__ import annotations

from pathlib import Path

from servesweep.config.experiment import load_experiment
from servesweep.matrix import planner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/qwen36-27b-rtxpro6000-decide.yaml"


def test_sharing_one_user_and_the_knee_bring_the_field_question_under_its_budget():
    exp = load_experiment(EXAMPLE)
    # the example opts in to the shared stream (off by default: it shares its guesses too); the knee is the default
    assert exp.decide is not None and exp.decide.share_one_user and exp.decide.knee_margin == 2
    assert "share_one_user" in exp.decide.model_fields_set
    on = planner.plan_experiment(exp, str(EXAMPLE)).decision
    off_block = exp.decide.model_copy(update={"share_one_user": False, "knee_margin": None})
    off = planner.plan_experiment(exp.model_copy(update={"decide": off_block}), str(EXAMPLE)).decision
    assert on is not None and off is not None
    assert on["within_budget"] and not off["within_budget"], (on["packed_wall_s"], off["packed_wall_s"])
    assert on["packed_wall_s"] < 0.75 * off["packed_wall_s"] and on["gpu_s"] < 0.8 * off["gpu_s"]
    # both settle every question (ties included): the levers cut probes, not answers
    for d in (on, off):
        assert d["counts"].get("open", 0) + d["counts"].get("leading", 0) == 0, d["counts"]

"""The field's whole question planned (`servesweep plan examples/qwen36-27b-rtxpro6000-decide.yaml`): about 20 s of
the planner's simulated decision, so in `make test` and not in the fast tier (test_decision_plan.py holds the small
plans). It starts no process."""

from __future__ import annotations

import io

from rich.console import Console

from servesweep.matrix import planner


def test_the_field_question_is_planned_against_its_budget():
    """Issue 33's target: `servesweep plan examples/qwen36-27b-rtxpro6000-decide.yaml` predicts the whole 8-GPU
    question's time to decision within its 2-hour budget, as `servesweep run` packs it (matrix/decision_packed.py:
    the same loop on virtual time). It was 2.51 h before one user's load-1 stream was shared by a prompt's output
    lengths and the loads above a cell's throughput knee were left unsearched (1.50 h with both, 2026-12-05)."""
    from pathlib import Path

    from servesweep.config.experiment import load_experiment

    path = Path(__file__).resolve().parents[2] / "examples/qwen36-27b-rtxpro6000-decide.yaml"
    exp = load_experiment(path)
    d = planner.plan_experiment(exp, str(path)).decision
    assert d is not None and d["questions"] == 30 and d["configs"] == 15
    assert d["budget_s"] == 7200 and d["within_budget"] and d["packed_wall_s"] <= 7200, d["packed_wall_s"]
    assert d["packed_wall_s"] < d["serial_s"] / 2 and d["packed_wall_s"] < d["grid_serial_s"] / 10
    assert d["counts"].get("open", 0) + d["counts"].get("leading", 0) == 0  # every question settled
    assert d["at_budget"] is None  # it ends before the budget: no answer cut short there
    out = io.StringIO()
    planner._print_decision(d, Console(file=out, width=300))
    text = out.getvalue()
    assert "budget 2.00h" in text and "exceeded" not in text, text

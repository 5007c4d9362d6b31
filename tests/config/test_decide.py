"""The decide: block (config/decide.py): a question the planner can plan, and clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.config.decide import DecideBlock
from servesweep.config.experiment import ExperimentError, load_experiment, parse_experiment

pytestmark = pytest.mark.fast

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen36-27b-rtxpro6000-decide.yaml"

BASE = """
name: d
sglang_version: "0.5.23"
target: {inventory: local, host_group: gpu, port: 0}
model: {path: Qwen/Qwen3.6-27B}
launcher: {kind: process, emulator: true, gpu: RTX PRO 6000 Blackwell, gpus_per_host: 8}
load:
  prompt_tokens: 3k
  output_tokens: 256
  concurrency: [1, 8, 64]
  requests: 32
"""


def _errors(decide: str) -> str:
    with pytest.raises(ExperimentError) as e:
        parse_experiment(BASE + decide, "x.yaml")
    return str(e.value)


def test_example_asks_the_whole_question():
    exp = load_experiment(EXAMPLE)
    d = exp.decide
    assert d is not None
    assert list(d.tiers) == ["tier1", "tier2", "tier3"]
    assert d.confidence == pytest.approx(0.95) and d.resolution == pytest.approx(0.05)
    assert d.max_probe_time_s == 50 and d.prior_margin == 1.1


def test_percentages_and_times_read_as_numbers():
    exp = parse_experiment(
        BASE + "decide:\n  tiers: [[decode_tokens_per_s_p50>=30]]\n  confidence: 90%\n  resolution: 0.1\n"
        "  max_probe_time: 5m\n"
    )
    d = exp.decide
    assert d is not None and list(d.tiers) == ["tier1"]
    assert (d.confidence, d.resolution, d.max_probe_time_s) == (pytest.approx(0.9), pytest.approx(0.1), 300)


def test_a_tier_must_judge_a_percentile_of_a_per_request_metric():
    msg = _errors("decide:\n  tiers:\n    fast: [output_tokens_per_s>=100]\n")
    assert "x.yaml:" in msg and "decide.tiers" in msg and "tier fast" in msg and "pNN" in msg
    assert "tpot_mean" in _errors("decide:\n  tiers:\n    t: [tpot_mean<=20ms]\n")


def test_bad_slo_text_names_the_tier():
    msg = _errors("decide:\n  tiers:\n    t: [ttft_p99<=banana]\n")
    assert "tier t" in msg


def test_unknown_key_and_bounds():
    assert "unknown key 'bestt'" in _errors("decide:\n  tiers: [[ttft_p95<=2s]]\n  bestt: x\n")
    assert "below decide.lower" in _errors("decide:\n  tiers: [[ttft_p95<=2s]]\n  lower: 8\n  upper: 4\n")
    assert "confidence" in _errors("decide:\n  tiers: [[ttft_p95<=2s]]\n  confidence: lots\n")


def test_decide_and_search_do_not_mix():
    msg = _errors(
        "decide:\n  tiers: [[ttft_p95<=2s]]\nsearch:\n  tiers: [[ttft_p95<=2s]]\n  upper: 64\n".replace(
            "concurrency: [1, 8, 64]", ""
        )
    )
    assert "decide" in msg


def test_a_search_block_reads_its_tiers_by_the_same_rules_with_its_own_refusals():
    from pydantic import ValidationError

    from servesweep.config.search_block import SearchBlock

    ok = SearchBlock(tiers=[["ttft<=1s", "goodput_ratio>=90%"], "tpot_p50<=50ms"], upper=64)  # tier1, tier2
    assert list(ok.tiers) == ["tier1", "tier2"]
    with pytest.raises(ValidationError, match="tier t: per-request SLOs only say which requests are good"):
        SearchBlock(tiers={"t": ["ttft<=1s"]}, upper=64)
    with pytest.raises(ValidationError, match="tier t: needs at least one SLO"):
        SearchBlock(tiers={"t": []}, upper=64)


@pytest.mark.fast
def test_cell_sigma_is_a_decide_setting_the_plan_and_the_run_share():
    """decide.cell_sigma (a percentage or a fraction) reaches run_decision through decision_settings, which both the
    plan's prediction and the run use; a wider cell error makes the fitted intervals wider, so the plan predicts no
    fewer probes; a negative one is refused with its key."""
    from servesweep.matrix.decision import Noise, run_decision, simulated_measure
    from servesweep.matrix.planner import decision_cells, decision_settings, make_plan

    base = {"tiers": {"t": ["decode_tokens_per_s_p50>=30"]}}
    assert DecideBlock.model_validate(base).cell_sigma == 0.05
    assert DecideBlock.model_validate({**base, "cell_sigma": "12%"}).cell_sigma == pytest.approx(0.12)
    with pytest.raises(ValueError, match="cell_sigma"):
        DecideBlock.model_validate({**base, "cell_sigma": -0.1})
    exp = load_experiment(EXAMPLE)
    assert decision_settings(exp)["cell_sigma"] == exp.decide.cell_sigma == 0.05

    def plan_gpu_s(cell_sigma: str) -> float:
        # the decision the plan and the run share, on the plan's cells (one at a time: the packed plan's lookahead
        # costs ~10 s a plan, and the setting's path is the same)
        text = EXAMPLE.read_text().replace("decide:\n", f"decide:\n  cell_sigma: {cell_sigma}\n", 1)
        e = parse_experiment(text)
        cells = decision_cells(make_plan(e))
        measure = simulated_measure(Noise(), {c.key: c.predicted for c in cells}, 0)
        run = run_decision(cells, e.decide.tiers, measure, **decision_settings(e), noise=Noise())
        return run.as_dict()["gpu_seconds"]

    assert plan_gpu_s("25%") > plan_gpu_s("5%")

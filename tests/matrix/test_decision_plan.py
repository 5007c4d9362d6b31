"""`servesweep plan` on an experiment with a decide: block: the predicted time to decision, packed onto the hosts,
and the confidence it reaches, printed and in --json (matrix/planner.py, attach_decision)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from servesweep.config.experiment import parse_experiment
from servesweep.matrix import planner
from servesweep.matrix.placement import GpuHost

pytestmark = pytest.mark.fast

SMALL = """
name: small-decide
sglang_version: "0.5.23"
target: {inventory: local, host_group: gpu, port: 0}
model: {path: Qwen/Qwen3.6-27B}
launcher: {kind: process, emulator: true, gpu: RTX PRO 6000 Blackwell, gpus_per_host: 8}
server:
  base: {context_length: 32768}
  axes: {tp_size: [1, 4]}
  bundles:
    - name: ar
    - name: dflash
      flags: {speculative_algorithm: DFLASH, speculative_draft_model_path: z-lab/Qwen3.6-27B-DFlash,
              speculative_num_draft_tokens: 16}
load:
  prompt_tokens: 3k
  output_tokens: 256
  concurrency: [1, 8, 32]
  requests: 32
decide:
  tiers:
    tier1: [decode_tokens_per_s_p50>=30]
    tier2: [decode_tokens_per_s_p50>=100]
  max_probe_time: 5m
budget: {wall_time: 2h}
"""


@pytest.fixture(scope="module")
def plan():
    p = planner.make_plan(parse_experiment(SMALL))
    planner.attach_decision(p, [GpuHost("h", 8)])
    return p


def test_cells_are_one_per_configuration_and_shape(plan):
    cells = planner.decision_cells(plan)
    assert sorted(c.config for c in cells) == sorted(cp.config.id for cp in plan.configs)
    assert {c.gpus for c in cells} == {1, 4} and all(c.lower == 1 and c.upper == 32 for c in cells)


def test_the_plan_predicts_time_and_confidence(plan):
    d = plan.decision
    assert d is not None and d["questions"] == 2 and d["configs"] == 4
    assert sum(d["counts"].values()) == 2
    assert 0 < d["packed_wall_s"] <= d["serial_s"] and d["gpu_s"] >= d["serial_s"]
    assert d["within_budget"] == (d["packed_wall_s"] <= 7200)
    # the run packs as the plan does (matrix/decision_packed.py): every configuration probed had a lane
    assert (
        d["lanes"] >= len({c for c in (q["best"] for q in d["answer"]) if c}) and d["restarts"] < d["lanes"]
    )
    assert planner.plan_json(plan)["decision"] is d
    out = io.StringIO()
    planner._print_decision(d, Console(file=out, width=200))
    text = out.getvalue()
    assert "time to decision" in text and "confidence it reaches" in text and "packed" in text
    assert "servesweep run packs it so" in text

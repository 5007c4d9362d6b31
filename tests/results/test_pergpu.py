"""Per-GPU normalisation (results/pergpu.py): the GPU count of a configuration and of a point, and `servesweep
compare`'s per-GPU rows, whose intervals map exactly from the totals' (the counts are constants)."""

from __future__ import annotations

import math

import pytest

from servesweep.results.compare import Change, metric, verdict
from servesweep.results.pergpu import (
    flags_gpus,
    manifest_gpus,
    point_gpus,
    with_per_gpu,
    with_per_gpu_changes,
)

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


def test_gpu_count_of_configurations_and_points():
    assert flags_gpus({"tp_size": 4, "dp_size": 2}) == 8 and flags_gpus({}) == 1
    assert flags_gpus({"tp_size": 4}, launcher_gpus=8) == 8  # the launcher's stated count wins
    man = {"experiment": {"launcher": {"gpus": None}}, "configs": {"tp1": {"flags": {}}, "tp8": {"flags": {"tp_size": 8}}}}
    assert manifest_gpus(man) == {"tp1": 1, "tp8": 8}
    labelled = {"point": {"labels": {"gpu_count": "4", "gpus": "0,1,2,3"}}}  # packed runs' `gpus` is the devices
    assert point_gpus(labelled, "tp8", man) == 4 and point_gpus({}, "tp8", man) == 8
    assert point_gpus({}, None, {}) is None  # servesweep load: unknown, the columns read "-"
    v = with_per_gpu({"output_tokens_per_s": 8000.0, "request_rate": 12.0, "ttft_p50": 5.0}, 8)
    assert v["output_tokens_per_s_per_gpu"] == 1000.0 and v["request_rate_per_gpu"] == 1.5
    assert with_per_gpu({"output_tokens_per_s": 1.0}, None)["output_tokens_per_s_per_gpu"] is None


def test_compare_per_gpu_changes_map_the_totals_interval():
    tok = metric("output_tokens_per_s")
    # TP1 (1 GPU, 1,000 tok/s) against TP8 (8 GPUs, 4,000 tok/s): 4x the total, half per GPU
    c = Change(tok, 1000.0, 4000.0, 3.0, (2.8, 3.2), "better")
    ttft = Change(metric("ttft_p50"), 10.0, 12.0, 0.2, (0.1, 0.3), "worse")
    out = with_per_gpu_changes([c, ttft], 1, 8, verdict, 0.02)
    assert [x.metric.name for x in out] == ["output_tokens_per_s", "output_tokens_per_s_per_gpu", "ttft_p50"]
    pg = out[1]
    assert (pg.a, pg.b) == (1000.0, 500.0) and pg.delta == pytest.approx(-0.5)
    assert pg.ci == pytest.approx(((1 + 2.8) / 8 - 1, (1 + 3.2) / 8 - 1)) and pg.verdict == "worse"
    assert "per GPU" in pg.metric.unit
    assert with_per_gpu_changes([c], None, 8, verdict, 0.02) == [c]
    na = Change(tok, 1.0, math.nan, math.nan, (math.nan, math.nan), "n/a")
    assert with_per_gpu_changes([na], 1, 1, verdict, 0.02)[1].verdict == "n/a"

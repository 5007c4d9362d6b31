"""A field of a load point end to end (issue 29: a new field takes its model and its users only): an experiment's
`load.request_id_prefix` reaches each LoadPoint, then every request's X-Request-Id and the records' request_id, so a
user finds one run's requests in a server's or gateway's log and joins them with the records. Real Locust against a
real emulator, whose ground truth holds the ids the server saw."""

from __future__ import annotations

import re
import time

import pytest
from support import emulator_experiment_head

from servesweep.config.experiment import ExperimentError, parse_experiment
from servesweep.driver.point_run import run_point
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

SIM_ARGS = ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"]
LOAD = "load: {concurrency: 2, prompt_tokens: 200, output_tokens: 4, requests: 4, request_id_prefix: %s}\n"


def test_the_experiments_request_id_prefix_reaches_the_server_and_the_records(tmp_path):
    exp = parse_experiment(emulator_experiment_head(tmp_path, "rid") + LOAD % "nightly-42")
    (cfg,), _ = exp.server_configs()
    (point,) = exp.points_for(cfg)[0]
    assert point.request_id_prefix == "nightly-42"
    with start_sim(SIM_ARGS, ground_truth=tmp_path / "ground_truth.jsonl") as sim:
        summary = run_point(point.replaced(base_url=sim.base_url), tmp_path / "point")
        ids = {r["request_id"] for r in read_parquet(tmp_path / "point" / "records.parquet").to_pylist()}
        deadline = time.monotonic() + 10  # the emulator flushes its ground truth at least once a second
        while not ids <= (seen := {d["id"] for d in sim.read_ground_truth()}) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert summary["requests"]["ok"] == 4 and summary["point"]["request_id_prefix"] == "nightly-42"
    assert len(ids) == 4 and all(re.fullmatch(r"nightly-42-[0-9a-f]{32}", i) for i in ids), ids
    assert ids <= seen, "the server saw each request under the id its record holds"


@pytest.mark.fast
def test_a_request_id_prefix_a_log_would_split_is_refused_with_its_line(tmp_path):
    text = emulator_experiment_head(tmp_path, "rid") + LOAD % '"nightly 42"'
    with pytest.raises(ExperimentError) as e:
        parse_experiment(text)
    (line,) = e.value.problems
    assert line.startswith(f"experiment.yaml:{len(text.splitlines())}: load.request_id_prefix: "), line

"""orchestrator.Lane, what each placement of a packed run runs as (servesweep.matrix.packed): a ServerRun of its
own (no copy of the main Runner's attributes, no class built at run time) with its own port, base URL, host, GPUs
and Ansible state over the run's one RunState (manifest, plan); the isolation twins left to the isolation phase;
a stop asked by a lane reaches the whole run, and a lane never clears one."""

from __future__ import annotations

import io
import signal
import textwrap

import pytest
from rich.console import Console
from support import emulator_experiment_head

from servesweep.config.experiment import load_experiment
from servesweep.matrix import orchestrator, run_setup
from servesweep.matrix.isolation_rerun import SUFFIX, add_samples
from servesweep.matrix.packed import PlacementRecord
from servesweep.results import manifest as mf


@pytest.fixture
def runner(tmp_path, monkeypatch):
    # create_run's git revision and controller facts start processes (git, uname): the fast tier starts none
    monkeypatch.setattr(mf, "git_revision", lambda path=None: None)
    monkeypatch.setattr(mf, "controller_facts", lambda: {})
    f = tmp_path / "exp.yaml"
    f.write_text(
        emulator_experiment_head(tmp_path, "lanetest")
        + textwrap.dedent(
            """\
              bundles:
                - name: a
                - name: b
            load:
              concurrency: [1, 2]
              prompt_tokens: [160]
              output_tokens: 4
              requests: 2
            """
        )
    )
    m = run_setup.create_run(load_experiment(f), tmp_path / "runs", experiment_file=str(f))
    r = orchestrator.Runner(m, console=Console(file=io.StringIO(), width=200))
    try:
        yield r
    finally:
        r.close()


def _placement(config: str, slot: int, gpus: str, port: int) -> PlacementRecord:
    return {
        "config": config,
        "host": "gpu-a",
        "address": "127.0.0.2",
        "gpus": gpus,
        "port": port,
        "slot": slot,
        "planned_start_s": 0.0,
        "planned_end_s": 10.0,
    }


@pytest.mark.fast
def test_a_lane_runs_the_runners_code_on_its_own_placement(runner):
    cid = next(iter(runner.m.configs))
    lane = orchestrator.Lane(runner, _placement(cid, 1, "2,3", 31234), orchestrator.Interrupted)
    assert not isinstance(lane, orchestrator.Runner)  # it holds no run-level state (exporter, signals, packing)
    assert lane.shared is runner.shared and lane.m is runner.m and lane.plan is runner.plan
    assert (lane.port, lane.tag, lane.base_url()) == (31234, "gpu-a:2,3", "http://127.0.0.2:31234")
    assert runner.port != 31234 and runner.base_url() != lane.base_url()  # the main Runner keeps its own
    v = lane.role_vars(cid, "started")
    assert v["sglang_server_hosts"] == "gpu-a" and v["sglang_server_port"] == 31234
    assert v["sglang_server_workdir"].endswith("/p31234")
    assert v["sglang_server_env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in runner.m.configs[cid]["env"]  # the lane's environment is a copy
    lane.console.print("hello")
    assert "[gpu-a:2,3] hello" in runner.console.file.getvalue()


@pytest.mark.fast
def test_a_lane_leaves_the_isolation_twins_to_the_isolation_phase(runner):
    first, second = list(runner.m.configs)[:2]
    placements = [_placement(first, 0, "0", 30001), _placement(second, 1, "1", 30002)]
    twins = add_samples(runner.m, {"placements": placements})
    twin = next(t for t in twins if runner.m.points[t]["config_id"] == first)
    assert twin.endswith(SUFFIX)
    lane = orchestrator.Lane(runner, placements[0], orchestrator.Interrupted)
    assert twin in runner._pending(first)
    assert lane._pending(first) == [pid for pid in runner._pending(first) if pid != twin]


@pytest.mark.fast
def test_a_lanes_stop_reaches_the_run_and_a_lane_never_clears_it(runner):
    cid = next(iter(runner.m.configs))
    lane = orchestrator.Lane(runner, _placement(cid, 0, "0", 30001), orchestrator.Interrupted)
    status = lane.console.status("a point")
    status.update("running")  # nothing asked to stop
    lane.stop_requested = True
    assert runner.stop_requested
    lane.stop_requested = False
    assert runner.stop_requested and lane.stop_requested
    lane.in_ansible = True
    assert not runner.in_ansible  # a lane's Ansible run is its own: the main thread's signal handler does not wait
    status.update("in Ansible: its next poll stops it")
    lane.in_ansible = False
    runner.shared.stop.signal = signal.SIGTERM  # the signal the main thread's handler took
    with pytest.raises(orchestrator.Interrupted, match="SIGTERM"), status:
        status.update("running")

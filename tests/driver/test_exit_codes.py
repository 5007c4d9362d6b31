"""Exit codes a CI job can trust (docs/reports.md, "Exit codes"), the probes that end like normal requests, and the
warning for a model name the server does not list: `servesweep load` and `servesweep run` against the emulator."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from support import emulator_experiment_head

from servesweep.sim.launch import start_sim

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]


@pytest.fixture(scope="module")
def sim():
    with start_sim(
        ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4", "--context-length", "2048"]
        + ["--enable-metrics"]
    ) as s:
        yield s


def load(args, tmp_path, timeout=180):
    return subprocess.run(
        [*SERVESWEEP, "load", *args, "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        start_new_session=True,
    )


def metric(base_url: str, name: str) -> float:
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    return sum(float(m[1]) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def summaries(tmp_path: Path) -> list[dict]:
    (run,) = (tmp_path / "runs").iterdir()
    return [json.loads(f.read_text()) for f in sorted(run.glob("*/summary.json"))]


def test_prompts_longer_than_the_context_exit_3_naming_the_point_and_error(sim, tmp_path):
    r = load(
        ["--base-url", sim.base_url, "--concurrency", "2", "--requests", "4", "--prompt-tokens", "3000"]
        + ["--output-tokens", "4"],
        tmp_path,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "failed: point c2: 0 of 4 measured requests succeeded; top error class http_400_context" in err, (
        err
    )
    (s,) = summaries(tmp_path)
    assert s["failure_check"]["pass"] is False and s["failure_check"]["top_error"] == "http_400_context"


def test_a_healthy_point_exits_0_and_its_probes_abort_nothing(sim, tmp_path):
    aborted = metric(sim.base_url, "sglang:num_aborted_requests_total")
    total = metric(sim.base_url, "sglang:num_requests_total")
    r = load(
        ["--base-url", sim.base_url, "--concurrency", "2", "--requests", "4", "--prompt-tokens", "200"]
        + ["--output-tokens", "8", "--max-failure-rate", "0%"],
        tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (s,) = summaries(tmp_path)
    assert s["failure_check"] == {
        "pass": True,
        "message": None,
        "warning": None,
        "top_error": None,
        "max_failure_rate": 0.0,
    }
    # the probes (template overhead, per-chunk usage) end as normal requests do: no abort in the server's counters,
    # and the summary says how many went out
    assert metric(sim.base_url, "sglang:num_aborted_requests_total") == aborted
    probes = s["probe_requests"]
    assert probes["requests"] == {"template_overhead": 1, "continuous_usage": 1, "models": 1}, probes
    gen = probes["requests"]["template_overhead"] + probes["requests"]["continuous_usage"]
    assert metric(sim.base_url, "sglang:num_requests_total") == total + 4 + gen
    assert not s["notes"]


def test_failure_share_above_max_failure_rate_exits_3(sim, tmp_path):
    # half of the requests get an injected 500 (X-Sim-Fault is per request: every other one through the rate)
    with start_sim(
        ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4", "--sim-fault-rate", "500=0.5"]
        + ["--sim-seed", "3"]
    ) as faulty:
        r = load(
            [
                "--base-url",
                faulty.base_url,
                "--concurrency",
                "2",
                "--requests",
                "16",
                "--prompt-tokens",
                "100",
            ]
            + ["--output-tokens", "4", "--max-failure-rate", "0.05"],
            tmp_path,
        )
    (s,) = summaries(tmp_path)
    failed, ok = s["requests"]["failed"], s["requests"]["ok"]
    assert failed and ok, s["requests"]  # some of each, or the seed tests nothing
    assert r.returncode == 3, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert f"point c2: {failed} of 16 requests failed" in err and "> max failure rate 5.0%" in err, err
    assert "top error class http_5xx" in err, err


def test_a_model_the_server_does_not_list_is_a_warning(sim, tmp_path):
    r = load(
        ["--base-url", sim.base_url, "--concurrency", "1", "--requests", "1", "--prompt-tokens", "100"]
        + ["--output-tokens", "2", "--model", "not-served"],
        tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr  # the emulator serves any name: a warning, not an error
    err = " ".join(r.stderr.split())
    assert "warning: model 'not-served' is not among the models" in err and "Qwen/Qwen3.6-27B" in err, err
    (s,) = summaries(tmp_path)
    assert any("'not-served' is not among the models" in n for n in s["notes"])


def test_run_exits_3_when_a_point_fails_above_load_max_failure_rate(tmp_path):
    """`servesweep run`: every point done, but with failed requests above `load.max_failure_rate` (injected 500s;
    the probes retry theirs)."""
    exp = tmp_path / "faulty.yaml"
    head = emulator_experiment_head(tmp_path, "faulty", load_time=0.1).replace(
        "sim_args: {sim_load_time: 0.1}",
        'sim_args: {sim_load_time: 0.1, sim_fault_rate: "500=0.3", sim_seed: 5}',
    )
    assert "sim_fault_rate" in head
    exp.write_text(
        head
        + textwrap.dedent(
            """\
            load:
              concurrency: [2]
              prompt_tokens: [100]
              output_tokens: 4
              requests: 10
              max_failure_rate: 0.0
            flush_cache_between_points: false
            """
        )
    )
    r = subprocess.run(
        [*SERVESWEEP, "run", str(exp), "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        start_new_session=True,
    )
    out = r.stdout + r.stderr
    (run,) = (tmp_path / "runs").iterdir()
    m = json.loads((run / "manifest.json").read_text())
    (p,) = m["points"].values()
    assert p["status"] == "done", (p, out[-3000:])
    counts = json.loads((run / p["dir"] / "summary.json").read_text())["requests"]
    assert counts["failed"] > 0, counts  # the seed must inject some
    assert r.returncode == 3, out[-3000:]
    err = " ".join(r.stderr.split())
    assert re.search(
        r"failed: point \S+: \d+ of 10 requests failed \(\S+ > max failure rate 0.0%\); top error class http_5xx",
        err,
    ), err

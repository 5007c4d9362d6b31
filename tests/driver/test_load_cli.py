"""`servesweep load` as a user runs it: a sweep against the emulator it starts itself, the table, the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from servesweep.cli.load import command
from servesweep.sim.launch import start_sim

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]
FAST_SIM = "--sim-calibration speedup=4 --enable-cache-report"


def run(args, tmp_path, timeout=180, env=None):
    return subprocess.run(
        [*SERVESWEEP, "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def test_sweep_prints_the_table_and_writes_parquet_and_json(tmp_path):
    r = run(
        ["--concurrency", "1,2", "--requests", "3", "--prompt-tokens", "500", "--output-tokens", "8"]
        + ["--sim-args", FAST_SIM, "--out", "runs"],
        tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "started the SGLang emulator" in r.stderr
    out = r.stdout
    # (at 150 columns, a pipe's width, rich puts the ITL columns' "ms" on a second header line)
    cols = ("conc", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL/chunk p50", "ITL/chunk p99", "ITL/token p50")
    for col in (*cols, "failures"):
        assert col in out, out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "2"]
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1 and f"results: {run_dirs[0].relative_to(tmp_path)}" in out.replace("\n", "")
    manifest = json.loads((run_dirs[0] / "manifest.json").read_text())
    assert [p["concurrency"] for p in manifest["points"]] == [1, 2]
    for p in manifest["points"]:
        d = run_dirs[0] / p["dir"]
        t = pq.read_table(d / "records.parquet")
        assert t.num_rows == 3 and t.column("error_class").null_count == 3
        s = json.loads((d / "summary.json").read_text())
        assert s["requests"]["ok"] == 3 and s["point"]["concurrency"] == p["concurrency"]
        assert s["output_tokens"] == 24 and s["prompt_tokens"]["max_abs_deviation_pct"] <= 0.5
        assert s["cache_hit_ratio"] <= 0.01


KEY = "sk-test-servesweep-7f3a9c"


@pytest.fixture(scope="module")
def keyed_sim():
    """An emulator that wants an API key (SGLang's --api-key: the server's own flag)."""
    with start_sim(
        ["--model-path", "Qwen/Qwen3.6-27B", "--api-key", KEY, "--sim-calibration", "speedup=4"]
    ) as s:
        yield s


def invoke(args, env=None):
    """In-process (load.py imports no Locust; each point still runs Locust as a subprocess)."""
    return CliRunner().invoke(command, args, env=env, catch_exceptions=False)


def test_json_output_and_slo_exit_code(keyed_sim, tmp_path):
    r = invoke(
        ["--base-url", keyed_sim.base_url, "--concurrency", "2", "--requests", "2", "--prompt-tokens", "400"]
        + ["--output-tokens", "4", "--json", "--out", str(tmp_path / "runs"), "--slo", "ttft_p99<=1ms"]
        + ["--api-key-env", "SS_TEST_KEY"],
        env={"SS_TEST_KEY": KEY},
    )
    assert r.exit_code == 1, "a breached SLO is exit code 1\n" + r.output
    d = json.loads(r.stdout)
    (point,) = d["points"]
    assert point["requests"]["ok"] == 2
    assert point["slos"] == [{"slo": "ttft_p99<=1ms", "value": point["ttft_ms"]["p99"], "pass": False}]
    assert Path(d["run_dir"]).is_dir()
    # the key came from the environment and is written nowhere
    written = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert any(p.name == "records.parquet" for p in written)
    for p in written:
        assert KEY.encode() not in p.read_bytes(), f"the API key leaked into {p}"
    assert KEY not in r.output


def test_wrong_or_missing_key_is_a_clear_error(keyed_sim, tmp_path):
    args = ["--base-url", keyed_sim.base_url, "--requests", "1", "--out", str(tmp_path / "runs")]
    r = invoke([*args, "--api-key-env", "SS_TEST_KEY"], env={"SS_TEST_KEY": "wrong", "OPENAI_API_KEY": None})
    assert r.exit_code == 2 and "HTTP 401" in r.output, r.output  # could not run (servesweep.exit_codes)
    assert "wrong" not in r.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.fast
def test_bad_input_names_the_option(tmp_path):
    cases = [
        (["--concurrency", "1,0"], "--concurrency"),
        (["--concurrency", "a"], "--concurrency"),
        (["--duration", "soon"], "--duration"),
        (["--slo", "ttft_p97<=1s"], "--slo"),
        (["--api-key-env", "SERVESWEEP_TEST_UNSET_KEY"], "SERVESWEEP_TEST_UNSET_KEY"),
        (["--endpoint", "responses"], "--endpoint"),
        (["--workers", "2", "--requests", "1"], "--workers"),
        (["--rate", "5"], "--rate"),
        (["--arrival", "poisson"], "--rate"),
        (["--arrival", "poisson", "--rate", "5,0"], "--rate"),
        (["--master-host", "10.0.0.1"], "--master-host"),
    ]
    for args, needle in cases:
        r = invoke(["--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "runs"), *args])
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.output, (args, r.output)
    assert not (tmp_path / "runs").exists(), "nothing is written before the input is valid"

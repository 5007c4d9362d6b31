"""`servesweep load` as a user runs it: a sweep against the emulator it starts itself, the table, the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

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
    for col in ("conc", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "failures"):
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


def test_json_output_and_slo_exit_code(tmp_path):
    r = run(
        ["--concurrency", "2", "--requests", "2", "--prompt-tokens", "400", "--output-tokens", "4", "--json"]
        + ["--sim-args", FAST_SIM, "--out", str(tmp_path / "runs"), "--slo", "ttft_p99<=1ms"],
        tmp_path,
    )
    assert r.returncode == 3, "a breached SLO is exit code 3\n" + r.stderr
    d = json.loads(r.stdout)
    (point,) = d["points"]
    assert point["requests"]["ok"] == 2
    assert point["slos"] == [{"slo": "ttft_p99<=1ms", "value": point["ttft_ms"]["p99"], "pass": False}]
    assert Path(d["run_dir"]).is_dir()


def test_bad_input_names_the_option(tmp_path):
    cases = [
        (["--concurrency", "1,0"], "--concurrency"),
        (["--concurrency", "a"], "--concurrency"),
        (["--duration", "soon"], "--duration"),
        (["--slo", "ttft_p97<=1s"], "--slo"),
        (["--api-key-env", "SERVESWEEP_TEST_UNSET_KEY"], "SERVESWEEP_TEST_UNSET_KEY"),
        (["--endpoint", "responses"], "--endpoint"),
    ]
    for args, needle in cases:
        r = run(["--base-url", "http://127.0.0.1:9", *args], tmp_path, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr, (args, r.stderr)
    assert not (tmp_path / "runs").exists(), "nothing is written before the input is valid"


def test_api_key_comes_from_the_environment_and_is_never_written(tmp_path):
    from servesweep.sim.launch import start_sim

    key = "sk-test-servesweep-7f3a9c"
    with start_sim(
        ["--model-path", "Qwen/Qwen3.6-27B", "--api-key", key, "--sim-calibration", "speedup=4"]
    ) as sim:
        args = ["--base-url", sim.base_url, "--concurrency", "1", "--requests", "2", "--prompt-tokens", "400"]
        args += ["--output-tokens", "4", "--out", "runs"]
        denied = run([*args, "--api-key-env", "SS_TEST_KEY"], tmp_path, env={"SS_TEST_KEY": "wrong"})
        ok = run([*args, "--api-key-env", "SS_TEST_KEY"], tmp_path, env={"SS_TEST_KEY": key})
    assert denied.returncode != 0 and "401" in denied.stderr, denied.stderr[-2000:]
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert key not in ok.stdout + ok.stderr
    written = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert any(p.name == "records.parquet" for p in written)
    for p in written:
        assert key.encode() not in p.read_bytes(), f"the API key leaked into {p}"

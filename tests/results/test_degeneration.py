"""Degenerate answers, end to end: `servesweep load` against the emulator, healthy and looping
(`--sim-answer-fault loop`), its summary's `degenerate_rate`, the console's warning, and `servesweep gate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]
SIM = ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=8", "--context-length", "8192"]


@pytest.fixture(scope="module")
def healthy():
    with start_sim(SIM) as s:
        yield s


@pytest.fixture(scope="module")
def looping():
    with start_sim([*SIM, "--sim-answer-fault", "loop"]) as s:
        yield s


def servesweep(*args, cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SERVESWEEP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "250"},
        start_new_session=True,
    )


def load(base_url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path, dict]:
    r = servesweep(
        "load", "--base-url", base_url, "--concurrency", "3", "--requests", "6", "--prompt-tokens", "2000",
        "--output-tokens", "64", "--out", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    (run,) = (tmp_path / "runs").iterdir()
    (summary,) = [json.loads(f.read_text()) for f in run.glob("*/summary.json")]
    return r, run, summary


def test_a_looping_server_is_degenerate_loudly_and_fails_the_gate(looping, tmp_path):
    r, run, s = load(looping.base_url, tmp_path)
    err = " ".join(r.stderr.split())
    assert s["requests"]["ok"] == 6 and s["output_tokens_per_s"] > 0  # fast, zero failures ...
    assert s["degenerate_rate"] == 1.0  # ... and garbage
    assert s["degeneration"]["judged"] == 6 and s["degeneration"]["degenerate"] == 6
    assert any("loop" in e for e in s["degeneration"]["examples"]), s["degeneration"]
    assert "DEGENERATE ANSWERS: 6 of 6 responses of point c3 are degenerate" in err, r.stderr
    texts = read_parquet(next(run.glob("*/records.parquet"))).column("response_text").to_pylist()
    assert all(t.count("lambda") >= 50 for t in texts), texts[0]
    g = servesweep("gate", str(run), "--slo", "degenerate_rate<=1%", cwd=tmp_path)
    assert g.returncode == 1, g.stdout + g.stderr
    assert "degenerate_rate = 100" in g.stdout, g.stdout


def test_a_healthy_server_passes_every_answer_check(healthy, tmp_path):
    r, run, s = load(healthy.base_url, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert s["degenerate_rate"] == 0.0 and s["degeneration"]["judged"] == 6
    assert "DEGENERATE" not in r.stdout + r.stderr
    texts = read_parquet(next(run.glob("*/records.parquet"))).column("response_text").to_pylist()
    assert all(len(t.split()) >= 40 for t in texts), texts
    g = servesweep("gate", str(run), "--slo", "degenerate_rate<=1%", cwd=tmp_path)
    assert g.returncode == 0, g.stdout + g.stderr

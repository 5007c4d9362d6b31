"""A closed loop's first wave leaves together (client/user.py `_wait_for_the_wave`): the users of a process wait
until all of them have spawned, so the burst a point sends is one burst even when Locust spawns them over time; a
spawn rate meant to trickle users in (slower than one second for all) is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from servesweep.sim.launch import start_sim

LOCUSTFILE = Path(__file__).resolve().parents[2] / "locustfiles" / "llm.py"
USERS = 12


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B"], log_path=d / "sim.log") as s:
        yield s


def sends(sim, tmp_path: Path, spawn_rate: float) -> dict:
    """Run USERS users sharing a budget of USERS requests, spawned at `spawn_rate` per second: their records."""
    records = tmp_path / f"r{spawn_rate:g}.parquet"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", sim.base_url, "--headless"]
    cmd += ["-u", str(USERS), "-r", str(spawn_rate), "--requests", str(USERS), "--records", str(records)]
    cmd += ["--prompt-tokens", "100", "--output-tokens", "4", "--only-summary"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True, env=os.environ)
    assert records.is_file(), r.stdout[-2000:] + r.stderr[-2000:]
    t = pq.read_table(records).to_pydict()
    assert len(t["sent_ns"]) == USERS, t
    return t


def spread_s(t: dict) -> float:
    return (max(t["sent_ns"]) - min(t["sent_ns"])) / 1e9


def test_the_first_wave_leaves_together(sim, tmp_path):
    # 12 users at 12/s: Locust spawns them over ~0.9 s; the wave still leaves within a fraction of that, one
    # request per user
    burst = sends(sim, tmp_path, USERS)
    assert sorted(burst["user"]) == list(range(USERS)) and spread_s(burst) < 0.3, (burst["user"], spread_s(burst))

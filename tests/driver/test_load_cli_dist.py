"""`servesweep load` with open-loop arrivals (a rate sweep), worker processes and --api-key-file: the key
reaches the Locust processes through their environment, never their command lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servesweep.sim.launch import start_sim

KEY = "sk-test-servesweep-keyfile-41d2"


def _locust_pids(root: int) -> list[int]:
    """The Locust processes under `root` (the servesweep process): its children's children, by /proc."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            todo.append(k)
            try:
                if b"locust" in Path(f"/proc/{k}/cmdline").read_bytes():
                    out.append(k)
            except OSError:
                pass
    return out


def test_rate_sweep_with_workers_and_a_key_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    with start_sim(
        ["--model-path", "Qwen/Qwen3.6-27B", "--api-key", KEY, "--sim-calibration", "speedup=8"]
    ) as sim:
        args = [
            "--base-url", sim.base_url, "--arrival", "poisson", "--rate", "20,40", "--concurrency", "4",
            "--requests", "30", "--workers", "2", "--prompt-tokens", "64", "--output-tokens", "8",
            "--api-key-file", str(key_file), "--out", str(tmp_path / "runs"), "--json",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "servesweep.cli", "load", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )
        seen: dict[int, tuple[bytes, bytes]] = {}
        try:
            while proc.poll() is None:
                for pid in _locust_pids(proc.pid):
                    try:
                        seen[pid] = (
                            Path(f"/proc/{pid}/cmdline").read_bytes(),
                            Path(f"/proc/{pid}/environ").read_bytes(),
                        )
                    except OSError:
                        pass
                time.sleep(0.2)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    assert len(seen) >= 2, "saw the Locust master and its workers"
    for cmdline, environ in seen.values():
        assert KEY.encode() not in cmdline, "the key is never on a command line"
        assert f"SERVESWEEP_API_KEY={KEY}".encode() in environ.split(b"\0"), "it travels in the environment"
    assert KEY not in out.decode() + err.decode()
    got = json.loads(out)
    assert [p["point"]["rate_rps"] for p in got["points"]] == [20.0, 40.0]
    for p in got["points"]:
        assert p["point"]["arrival"] == "poisson" and p["point"]["api_key_env"] == "SERVESWEEP_API_KEY"
        assert p["requests"]["ok"] == 30 and p["failures"] == {}, "every request was let in with the key"
        assert p["arrivals"]["processes"] == 2 and p["schedule_lag_ms"]["n"] == 30
        assert not p["degraded"]
    # the table shows the asked and the achieved rate and the schedule lag of each point
    from rich.console import Console

    from servesweep.results.table import results_table

    con = Console(width=260, record=True)  # as servesweep load prints it without a terminal
    con.print(results_table(got["points"]))
    text = con.export_text()
    for col in ("arrival", "rate /s", "got /s", "lag p50 ms", "lag p99 ms"):
        assert col in text, text
    rows = [line.split("│")[1:6] for line in text.splitlines() if line.startswith("│ poisson")]
    assert [r[1].strip() for r in rows] == ["20", "40"], text
    for r, p in zip(rows, got["points"], strict=True):
        assert float(r[2]) == round(p["arrivals"]["rate_rps"], 2)


@pytest.mark.fast
def test_worker_host_options_are_checked_before_any_load(tmp_path):
    from click.testing import CliRunner

    from servesweep.cli.load import command

    inv = tmp_path / "inventory.ini"
    inv.write_text("[loadgen]\nw1 ansible_host=10.0.0.7\n")
    base = [
        "--base-url",
        "http://127.0.0.1:9",
        "--out",
        str(tmp_path / "runs"),
        "--worker-inventory",
        str(inv),
    ]
    for extra, needle in (
        ([], "--master-host"),
        (["--master-host", "10.0.0.5", "--workers", "2"], "--worker-inventory, not both"),
        (["--master-host", "10.0.0.5", "--workers-per-host", "0"], "--workers-per-host"),
    ):
        r = CliRunner().invoke(command, base + extra, catch_exceptions=False)
        assert r.exit_code == 2 and needle in r.output, (extra, r.output)
    assert not (tmp_path / "runs").exists()

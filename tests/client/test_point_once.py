"""The point reaches the Locust child once: as point.json (issue 29). servesweep's Locust command line carries no
value of the point (no --host, -u, -r, -t, -s); the child sets Locust's own options from the file at init
(client/options.py), and a command line that says otherwise beside the file (a stray --host or -u) is refused
before any load is sent, naming both values."""

from __future__ import annotations

import os
import subprocess

import pytest

from servesweep.config.point import LoadPoint
from servesweep.driver.command import locust_command, master_command
from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"
# Locust's options that would say something of the point
POINT_OPTIONS = {
    "--host",
    "-H",
    "-u",
    "--users",
    "-r",
    "--spawn-rate",
    "-t",
    "--run-time",
    "-s",
    "--stop-timeout",
}


def _point(base_url: str = "http://127.0.0.1:9", **kw) -> LoadPoint:
    fields = {"concurrency": 3, "prompt_tokens": 64, "output_tokens": 8, "requests": 6, **kw}
    return LoadPoint(base_url=base_url, model=MODEL, probe=False, **fields)


@pytest.mark.fast
def test_the_command_line_carries_no_value_of_the_point(tmp_path):
    p = _point(duration_s=5.0, requests=None)
    (tmp_path / "point.json").write_text(p.model_dump_json())
    commands = {
        "alone": locust_command(p, tmp_path),
        "with worker processes": locust_command(p, tmp_path, workers=2),
        "master": master_command(p, tmp_path, expect_workers=2, bind_host="127.0.0.1", bind_port=5557),
    }
    for name, cmd in commands.items():
        assert not POINT_OPTIONS & set(cmd), (name, cmd)
        assert not any(p.base_url in a for a in cmd), (name, cmd)
        assert cmd[cmd.index("--point-json") + 1] == str(tmp_path / "point.json"), name


@pytest.mark.fast
def test_a_command_for_another_point_than_its_file_is_refused(tmp_path):
    (tmp_path / "point.json").write_text(_point(concurrency=3).model_dump_json())
    with pytest.raises(ValueError, match="holds another point"):
        locust_command(_point(concurrency=4), tmp_path)
    with pytest.raises(ValueError, match="no point to run"):
        locust_command(_point(), tmp_path / "missing")


def _run(cmd: list[str], **env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVESWEEP_WATCH_PARENT": "0", **env_extra}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, start_new_session=True)


@pytest.mark.parametrize(
    "stray, env, said",
    [
        (["--host", "http://127.0.0.1:10"], {}, "--host http://127.0.0.1:10, the point's http://127.0.0.1:9"),
        (["-u", "7"], {}, "-u/--users 7, the point's 3"),
        (
            [],
            {"LOCUST_HOST": "http://127.0.0.1:11"},
            "--host http://127.0.0.1:11, the point's http://127.0.0.1:9",
        ),
    ],
    ids=["host", "users", "LOCUST_HOST"],
)
def test_a_stray_option_beside_the_point_file_is_refused(tmp_path, stray, env, said):
    """Someone reruns a point's Locust command by hand and adds --host (or -u), or has LOCUST_HOST exported: the
    file and the option disagree, and neither silently wins: the child exits 2 (could not run) before it sends
    anything, naming both values."""
    (tmp_path / "point.json").write_text(_point().model_dump_json())
    r = _run([*locust_command(_point(), tmp_path), *stray], **env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "COULD NOT RUN" in r.stderr and said in r.stderr, r.stderr[-3000:]
    assert "leave those options out" in r.stderr
    assert not (tmp_path / "records.parquet").exists()


def test_the_point_file_sets_the_users_and_the_host(tmp_path):
    """Without -u or --host on its command line the child runs the point's concurrency against the point's server
    (Locust's own log says how many users it spawned), and every request of the budget is recorded."""
    gt = tmp_path / "gt.jsonl"
    with start_sim(["--model-path", MODEL, "--sim-calibration", "speedup=4"], ground_truth=gt) as sim:
        p = _point(sim.base_url)
        (tmp_path / "point.json").write_text(p.model_dump_json())
        r = _run(locust_command(p, tmp_path))
        served = {d["id"] for d in sim.stop_and_read_ground_truth()}
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert 'All users spawned: {"LLMUser": 3}' in out, out[-3000:]
    import pyarrow.parquet as pq

    recs = pq.read_table(tmp_path / "records.parquet").to_pylist()
    assert len(recs) == 6 and {r["request_id"] for r in recs} <= served

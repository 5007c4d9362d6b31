"""A server dies in one placement of a packed run (its recorded process group killed mid-point): that placement's
server is restarted through Ansible and its point retried, while the other placement's server keeps serving and
its points finish; every point ends done exactly once (the crashed attempt's records kept aside, never as the
point's result)."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import yaml
from packed_experiment import EXPERIMENT
from test_reliability_server import cleanup, manifest, run_dir_of
from test_reliability_server import start as start_servesweep


def _t(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def _experiment(tmp: Path) -> Path:
    exp = json.loads(json.dumps(EXPERIMENT))
    exp["name"] = "packed-crash"
    # real time (no speed-up): a request of 160 tokens streams for a few seconds, so a kill lands mid-point
    exp["launcher"].update(workdir=str(tmp / "srv"), stop_timeout_s=20, sim_args={"sim_load_time": 0.3})
    exp["server"]["axes"] = {"tp_size": [1, 4]}
    exp["load"].update(concurrency=[1, 2], prompt_tokens=[100], output_tokens=160, requests=4)
    # no needle probes: at real time they cost 5-30 s per server start and this test is about the crash
    exp.update(flush_cache_between_points=False, retries=1, answers={"needle_probes": False})
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    return f


def _kill_mid_point(proc, runs: Path, srv: Path) -> tuple[Path, str, str, int, float, list]:
    """When both placements stream, SIGKILL the process group in the first placement's pidfile (the TP1 server);
    returns the run folder, the point it died under, the other configuration, the killed pid and when, and the
    server targets the run had registered in the observe stack's folder at that moment (file_sd groups)."""
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        run_dir = run_dir_of(runs)
        m = manifest(run_dir) if run_dir else None
        if m and m.get("packing"):
            running = {p["config_id"]: pid for pid, p in m["points"].items() if p["status"] == "running"}
            victim = next(pl for pl in m["packing"]["placements"] if pl["gpus"] == "0")
            other = next(c for c in running if c != victim["config"]) if len(running) >= 2 else None
            if other and m["points"][running[victim["config"]]]["attempts"] == 1:
                time.sleep(1.0)  # well inside the point (4 requests of 160 tokens)
                targets = [
                    g for f in sorted((runs / ".observe" / "targets").glob("sglang-*.json"))
                    for g in json.loads(f.read_text())
                ]  # fmt: skip
                pgid = int((srv / f"p{victim['port']}" / "server.pid").read_text())
                os.killpg(pgid, signal.SIGKILL)
                return run_dir, running[victim["config"]], other, pgid, time.time(), targets
        time.sleep(0.05)
    raise AssertionError("the two placements never streamed at the same time")


def test_a_server_dying_in_one_placement_is_restarted_while_the_other_keeps_running(tmp_path):
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    # no isolation sample (test_packed_hosts, test_isolation and test_packed_kills run it): two server starts and
    # two points fewer, the crash and its restart unchanged
    args = ["run", str(_experiment(tmp_path)), "--out", str(runs), "--max-parallel", "2", "--no-isolation-sample"]
    proc = start_servesweep(args, tmp_path, tmp_path / "run.log")
    run_dir = None
    try:
        run_dir, died, other, killed, killed_at, targets = _kill_mid_point(proc, runs, srv)
        rc = proc.wait(timeout=600)  # a loaded 2-core machine; ~100 s idle
        out = (tmp_path / "run.log").read_text()
        assert rc == 0, out[-4000:]
        m = manifest(run_dir)
        victim = m["points"][died]["config_id"]
        # while they ran, the observe stack's folder named every placement's server, with its host and GPUs
        placed = m["packing"]["placements"]
        assert sorted((g["targets"], g["labels"]["config"], g["labels"]["gpus"]) for g in targets) == sorted(
            ([f"{pl['address']}:{pl['port']}"], pl["config"], pl["gpus"]) for pl in placed
        ), targets
        assert not list((runs / ".observe" / "targets").glob("*.json"))  # gone with the run
        # the dead placement: crash recorded, server restarted on the same GPUs and port, the point retried
        c = m["configs"][victim]
        assert [x["point"] for x in c["crashes"]] == [died] and c["restarts"] == 1, c
        assert m["points"][died]["attempts"] == 2 and m["points"][died]["status"] == "done"
        assert (run_dir / "crashed" / f"{died}.1" / "server.log").is_file()
        assert f"retrying {died}" in out
        pl = next(x for x in m["packing"]["placements"] if x["config"] == victim)
        assert c["server"]["pid"] != killed and m["points"][died]["point"]["base_url"].endswith(
            f":{pl['port']}"
        )
        # the other placement kept its server and finished its points, some after the crash
        o = m["configs"][other]
        assert not o.get("crashes") and not o.get("restarts"), o
        mine = [p for p in m["points"].values() if p["config_id"] == other]
        assert all(p["attempts"] == 1 for p in mine) and max(_t(p["finished"]) for p in mine) > killed_at
        # every point done exactly once, each in its own folder
        assert all(p["status"] == "done" for p in m["points"].values()), m["points"]
        assert [p["attempts"] for p in m["points"].values()].count(2) == 1
        folders = sorted(d.name for d in run_dir.iterdir() if (d / "summary.json").is_file())
        assert folders == sorted(m["points"]) and len(folders) == 4
        assert m["packing"]["isolation_sample"] is False and not [p for p in m["points"].values() if p.get("isolation_of")]
        for pid in m["points"]:
            s = json.loads((run_dir / pid / "summary.json").read_text())
            assert s["requests"]["ok"] == 4 and s["requests"]["failed"] == 0, (pid, s["requests"])
    finally:
        cleanup(proc, run_dir, srv)

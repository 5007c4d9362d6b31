"""`servesweep run --max-parallel N`: placed configurations run side by side on this machine's 8 declared GPUs, each
with its own emulator (the sglang_server role with CUDA_VISIBLE_DEVICES and its own port) and Locust master. What a
user checks: configurations that share no GPU ran at the same time, configurations that share one never did,
every point is done exactly once, and each point carries the host and GPUs it ran on."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml

EXPERIMENT = {
    "name": "packed",
    "sglang_version": "0.5.23",
    "target": {"inventory": "local", "host_group": "gpu", "port": 0},
    "model": {"path": "Qwen/Qwen3.6-27B"},
    "launcher": {
        "kind": "process",
        "emulator": True,
        "gpu": "H200",
        "gpus_per_host": 8,
        "startup_timeout_s": 120,
        "sim_args": {"sim_load_time": 0.3, "sim_calibration": "speedup=20"},
    },
    "server": {
        "base": {"context_length": 8192, "max_running_requests": 16},
        "axes": {"tp_size": [1, 4, 8], "mem_fraction_static": [0.8, 0.85]},
    },
    "load": {
        "workload": "chat",
        "concurrency": [1, 2],
        "prompt_tokens": [256],
        "output_tokens": 8,
        "requests": 2,
        "warmup_s": 0,
    },
}


def _t(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def test_packed_run_places_servers_side_by_side_and_runs_every_point_once(tmp_path: Path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(EXPERIMENT))
    cmd = [
        str(Path(sys.executable).parent / "servesweep"),
        "run",
        str(exp),
        "--out",
        str(tmp_path / "runs"),
        "--max-parallel",
        "4",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    m = json.loads((run_dir / "manifest.json").read_text())
    placements = {pl["config"]: pl for pl in m["packing"]["placements"]}
    assert len(placements) == 6
    assert {pl["gpus"] for pl in placements.values()} >= {"0", "1", "4,5,6,7", "0,1,2,3,4,5,6,7"}
    # when each configuration held its GPUs: from its server start to its last point's end
    spans = {}
    for cid, c in m["configs"].items():
        # the packed phase only: the isolation sample's alone re-runs come after it (test_isolation.py)
        ends = [
            _t(p["finished"])
            for p in m["points"].values()
            if p["config_id"] == cid and not p.get("isolation_of")
        ]
        spans[cid] = (_t(c["started"]), max(ends))
    overlapped = False
    for a, b in itertools.combinations(spans, 2):
        share = set(placements[a]["gpus"].split(",")) & set(placements[b]["gpus"].split(","))
        apart = spans[a][1] <= spans[b][0] or spans[b][1] <= spans[a][0]
        if share:
            assert apart, (a, b, spans[a], spans[b])
        overlapped |= not apart
    assert overlapped, spans  # the TP1 and TP4 servers ran at the same time
    # every point done exactly once, in its own folder, labelled with where it ran
    assert all(p["status"] == "done" and p["attempts"] == 1 for p in m["points"].values())
    folders = [d for d in run_dir.iterdir() if (d / "summary.json").is_file()]
    assert sorted(d.name for d in folders) == sorted(m["points"])
    for p in m["points"].values():
        pl = placements[p["config_id"]]
        assert p["point"]["labels"]["host"] == "localhost" and p["point"]["labels"]["gpus"] == pl["gpus"]
        assert p["point"]["base_url"].endswith(f":{pl['port']}")
    # the server got its GPUs
    for cid, pl in placements.items():
        env = json.loads((run_dir / "servers" / cid / "server_info.json").read_text()).get("env") or {}
        if env:
            assert env.get("CUDA_VISIBLE_DEVICES") == pl["gpus"]

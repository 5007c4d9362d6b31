"""An API key in a packed run: two placements (TP1 and TP4 on this machine's 8 declared GPUs) run side by side, each
lane's ansible-runner call hiding the key's variables from Ansible while the other's may be going. The key comes
from a 0600 file and, in the second case, from the environment (`launcher.api_key_env`: the key is then in this
process's environment, the case where one thread putting it back while another's playbook started would leak it).
Both servers enforce the key, and no file of the run (ansible artifacts `command`, `job_events`, `stdout` of every
lane included) nor any command line holds it."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from packed_experiment import EXPERIMENT
from test_reliability_server import cleanup, manifest, run_dir_of
from test_secrets import _scan_cmdlines


def _experiment(tmp: Path, launcher: dict) -> Path:
    exp = json.loads(json.dumps(EXPERIMENT))
    exp["name"] = "packed-keys"
    exp["launcher"].update(workdir=str(tmp / "srv"), **launcher)
    exp["server"]["axes"] = {"tp_size": [1, 4]}
    exp["load"].update(concurrency=[2], requests=3)
    f = tmp / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    return f


@pytest.mark.parametrize("source", ["env"])  # a key from a file: tests/matrix/test_secret_sources.py (serial)
def test_a_key_in_a_packed_run_reaches_every_server_and_leaks_into_no_artifact(tmp_path, source):
    key = f"sk-packed-{source}-" + secrets.token_hex(16)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if source == "file":
        (tmp_path / "api.key").write_text(key + "\n")
        (tmp_path / "api.key").chmod(0o600)
        exp = _experiment(tmp_path, {"api_key_file": "api.key"})
    else:
        env["SS_PACKED_KEY"] = key
        exp = _experiment(tmp_path, {"api_key_env": "SS_PACKED_KEY"})
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    hits: list[str] = []
    scans: list[int] = []
    stop = threading.Event()
    scanner = threading.Thread(target=_scan_cmdlines, args=(key.encode(), hits, stop, scans), daemon=True)
    scanner.start()
    cmd = [
        str(Path(sys.executable).parent / "servesweep"),
        "run",
        str(exp),
        "--out",
        str(runs),
        "--max-parallel",
        "2",
        "--no-isolation-sample",  # the key reaches the packed servers; no second start of each for the twins
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        stop.set()
        scanner.join(timeout=10)
        cleanup(proc, run_dir_of(runs), srv)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    run_dir = run_dir_of(runs)
    m = manifest(run_dir)
    assert len(m["packing"]["placements"]) == 2
    assert all(p["status"] == "done" for p in m["points"].values()), m["points"]
    assert all(json.loads((run_dir / p["dir"] / "summary.json").read_text())["requests"]["ok"] == 3 for p in m["points"].values())
    # both lanes went through Ansible (start and stop of each server), each with its own artifacts
    commands = list(run_dir.rglob("command"))
    assert len(commands) >= 4, commands
    for c in commands:
        assert "SS_PACKED_KEY" not in json.loads(c.read_text())["env"]
    assert key not in text
    assert len(scans) > 20 and not hits, hits[:1]
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["packing"]["isolation_sample"] is False and not [p for p in m["points"].values() if p.get("isolation_of")]
    assert "isolation sample off" in text
    files = [f for f in run_dir.rglob("*") if f.is_file()]
    leaked = [str(f) for f in files if key.encode() in f.read_bytes()]
    assert not leaked, leaked
    # on the server side, only 0600 files of each placement's work folder hold it: the secret files and the server's
    # own log (the emulator logs its api_key at start, as SGLang does)
    holders = [f for f in srv.rglob("*") if f.is_file() and key.encode() in f.read_bytes()]
    assert holders and {f.name for f in holders} <= {"secret.yaml", "secret.key", "secret.env", "server.log"}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in holders), holders
    assert len({f.parent for f in holders}) == 2  # one work folder per placement

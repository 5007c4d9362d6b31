"""A matrix run with a known API key (from the environment; the server gets it through a 0600 config file, never
argv): the key is never on any process's command line while the run goes, and appears in no file of the run folder
(manifest, records, summaries, logs, Ansible artifacts, report), nor in the run's console output or the server's
log. The server really enforced the key (a request without it gets 401)."""

from __future__ import annotations

import json
import os
import secrets
import stat
import threading
import time
import urllib.error
import urllib.request

import psutil
from test_reliability_server import cleanup, manifest, run_dir_of, start, write_experiment

ENV = "SERVESWEEP_SECRETS_TEST_KEY"


def _scan_cmdlines(key: bytes, hits: list, stop: threading.Event, seen: list) -> None:
    while not stop.is_set():
        n = 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    c = f.read()
            except OSError:
                continue
            n += 1
            if key in c:
                hits.append(c.replace(b"\0", b" ").decode(errors="replace"))
        seen.append(n)
        time.sleep(0.05)


def wait_probing_without_key(proc, runs, timeout_s: float = 240) -> tuple:
    """Wait for `servesweep run` to end (bounded); while a point runs, send the server one request without the key.
    Returns (run folder, that request's HTTP status: the server must refuse it)."""
    run_dir, refused = None, None
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        run_dir = run_dir or run_dir_of(runs)
        m = manifest(run_dir) if run_dir else None
        if refused is None and m and any(p["status"] == "running" for p in m["points"].values()):
            req = urllib.request.Request(
                f"http://127.0.0.1:{m['port']}/v1/chat/completions",
                data=json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(req, timeout=10).close()
                refused = 200
            except urllib.error.HTTPError as e:
                refused = e.code
        time.sleep(0.1)
    return run_dir, refused


def test_the_api_key_never_leaks(tmp_path):
    key = "sk-sweep-" + secrets.token_hex(16)
    exp = write_experiment(tmp_path, retries=0, name="secret", needle_probes=True)
    text = exp.read_text().replace("  sim_args:", f"  api_key_env: {ENV}\n  sim_args:")
    exp.write_text(
        text.replace("concurrency: [1, 2]", "concurrency: [2]").replace(
            "output_tokens: 160", "output_tokens: 8"
        )
    )
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    hits: list[str] = []
    scans: list[int] = []
    stop = threading.Event()
    scanner = threading.Thread(target=_scan_cmdlines, args=(key.encode(), hits, stop, scans), daemon=True)
    scanner.start()
    proc = start(["run", str(exp), "--out", str(runs)], tmp_path, tmp_path / "run.log", env={ENV: key})
    run_dir = None
    refused = None
    try:
        run_dir, refused = wait_probing_without_key(proc, runs)
        rc = proc.wait(timeout=60)
    finally:
        stop.set()
        scanner.join(timeout=10)
        cleanup(proc, run_dir, srv)
    out = (tmp_path / "run.log").read_text()
    assert rc == 0, out[-3000:]
    m = manifest(run_dir)
    assert all(p["status"] == "done" for p in m["points"].values()), m["points"]
    assert all(json.loads((run_dir / p["dir"] / "summary.json").read_text())["requests"]["ok"] == 3 for p in m["points"].values())
    assert refused == 401, f"a request without the key got {refused}: the server did not enforce it"
    assert len(scans) > 20, "the process list was scanned while the run went"
    assert not hits, f"the key is on a command line: {hits[0][:300]}"
    assert key not in out
    # every file of the run folder (manifest, records, summaries, Locust logs, Ansible artifacts, report)
    files = [f for f in run_dir.rglob("*") if f.is_file()]
    assert len(files) > 10 and any("ansible" in f.parts for f in files)
    leaked = [str(f) for f in files if key.encode() in f.read_bytes()]
    assert not leaked, leaked
    # on the server host: only 0600 files hold it: the secret files, and the server's own log (SGLang 0.5.23 logs
    # its api_key at start, and so does the emulator); the launch script does not. The run folder's copy of that
    # log (checked above) and of /server_info (which shows the key) are redacted by the role's probe.
    workdir = next(srv.iterdir())
    holders = sorted(f.name for f in workdir.rglob("*") if f.is_file() and key.encode() in f.read_bytes())
    assert set(holders) <= {"secret.env", "secret.yaml", "secret.key", "server.log"} and holders, holders
    assert "server.log" in holders, "the emulator logs its api_key as SGLang does: the redaction is not tested"
    assert "<redacted>" in (run_dir / "servers" / next(iter(m["configs"])) / "server.log").read_text()
    for name in holders:
        assert stat.S_IMODE((workdir / name).stat().st_mode) == 0o600, name
    assert key not in (workdir / "launch.sh").read_text()
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(str(run_dir) in a for a in (p.info["cmdline"] or []))
    ]

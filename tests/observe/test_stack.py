"""`servesweep observe up|down|status` with a real Prometheus (the Debian package on PATH).

Each test that needs Prometheus starts its own stack on a temporary results root and a free port (about 1 s), through
the real CLI in a subprocess, and stops it at the end. What is held:
- a target registered after `up` is scraped within seconds, with no restart and no edit; unregistering drops it;
- `up` twice finds the recorded process and starts no other;
- `down` stops exactly the recorded process: one whose command line names the stack folder survives, and a record
  whose pid belongs to another process (start time differs) is dropped without a signal;
- `promtool check config` accepts the generated config with registered target files;
- Grafana's provisioning is valid YAML naming the stack's Prometheus and every dashboard JSON;
- a finished run backfilled into the stack shows in Prometheus as history (40 days back).
- the target files of a process that is gone are swept; a live owner's, another host's and a hand-written one stay.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from ruamel.yaml import YAML

from servesweep.observe import stack, stackdir
from servesweep.observe.stackdir import Layout, register_targets, stack_dir, unregister

pytestmark = [pytest.mark.timeout(300)]  # prometheus and promtool: Debian's packages (make test installs them)
REPO_DASHBOARDS = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != stackdir.ENV_DIR}
    return subprocess.run([sys.executable, "-m", "servesweep.cli", "observe", *args],
                          capture_output=True, text=True, timeout=45, env=env)  # fmt: skip


def _query(url: str, expr: str, at: float | None = None) -> list[dict]:
    q = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(q)}", timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def _active(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=5) as r:
        return json.loads(r.read())["data"]["activeTargets"]


def _wait(cond, timeout: float, what: str) -> float:
    """Poll cond() until truthy; returns the seconds it took."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout}s"
        time.sleep(0.2)
    return time.monotonic() - t0


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.delenv(stackdir.ENV_DIR, raising=False)
    yield tmp_path
    # Whatever a test left running, stop it by its record (never by name).
    for service in ("grafana", "prometheus"):
        stack._stop(Layout(stack_dir(tmp_path)).record(service), 5.0)


def _up(root: Path, port: int) -> subprocess.CompletedProcess:
    r = _cli("up", "--root", str(root), "--port", str(port), "--scrape-interval", "1s", "--no-grafana")
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_a_target_registered_after_up_is_scraped_without_restart(root):
    port = _free_port()
    out = _up(root, port).stdout
    url = f"http://127.0.0.1:{port}"
    assert url in out and "started: prometheus" in out
    reg = CollectorRegistry()
    Gauge("stack_test_value", "a value to find", registry=reg).set(42)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        mport = server.server_address[1]
        path = register_targets("servesweep", [f"127.0.0.1:{mport}"], {"run_id": "live-1"}, root=root)
        assert path.parent == root.resolve() / ".observe" / "targets"
        # A server whose metrics live on another path (file_sd's __metrics_path__), as register_targets allows.
        register_targets("sglang", [f"127.0.0.1:{mport}"], {"run_id": "live-1", "config": "tp1",
                                                            "__metrics_path__": "/other"}, root=root)  # fmt: skip
        took = _wait(lambda: [s["value"][1] for s in _query(url, 'up{run_id="live-1"}')] == ["1", "1"],
                     20, "both targets up")  # fmt: skip
        assert took < 15
        got = _query(url, 'stack_test_value{job="servesweep", run_id="live-1"}')
        assert [s["value"][1] for s in got] == ["42"]
        scrape_urls = {t["labels"]["job"]: t["scrapeUrl"] for t in _active(url)}
        assert scrape_urls["sglang"].endswith("/other") and scrape_urls["servesweep"].endswith("/metrics")

        st = _cli("status", "--root", str(root))
        assert st.returncode == 0 and "2 active target(s)" in st.stdout, st.stdout

        assert unregister("servesweep", {"run_id": "live-1"}, root=root)
        assert not unregister("servesweep", {"run_id": "live-1"}, root=root)
        _wait(
            lambda: {t["labels"]["job"] for t in _active(url)} == {"sglang"},
            20,
            "unregistered target dropped",
        )
    finally:
        server.shutdown()
    assert _cli("down", "--root", str(root)).returncode == 0


def test_up_twice_is_idempotent(root):
    port = _free_port()
    _up(root, port)
    rec_path = Layout(stack_dir(root)).record("prometheus")
    first = json.loads(rec_path.read_text())
    again = _up(root, port).stdout
    assert "already running" in again
    assert json.loads(rec_path.read_text()) == first  # same pid, same start time: nothing new started
    assert stackdir.running(rec_path) is not None
    assert _cli("down", "--root", str(root)).returncode == 0


def _plant(stack_folder: Path) -> subprocess.Popen:
    """A process whose command line names the stack folder and its config, as a Prometheus of it would."""
    cfg = stack_folder / "prometheus" / "prometheus.yml"
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(50)", f"--config.file={cfg}", "prometheus"]
    )


def test_down_stops_exactly_the_recorded_process(root):
    port = _free_port()
    _up(root, port)
    lay = Layout(stack_dir(root))
    rec = json.loads(lay.record("prometheus").read_text())
    planted = _plant(lay.dir)
    try:
        r = _cli("down", "--root", str(root))
        assert r.returncode == 0 and "stopped: prometheus" in r.stdout, r.stdout + r.stderr
        # the recorded Prometheus is gone (or a reaped zombie)
        assert stackdir.process_start_time(rec["pid"]) is None
        assert planted.poll() is None  # the look-alike lives on
        assert not lay.record("prometheus").exists()
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
        # A stale record: the planted pid with another start time (the pid was reused) is not signalled.
        stale = {
            "pid": planted.pid,
            "start_time": psutil.Process(planted.pid).create_time() - 100.0,
            "url": "x",
        }
        lay.record("prometheus").write_text(json.dumps(stale))
        r = _cli("down", "--root", str(root))
        assert r.returncode == 0 and "nothing running" in r.stdout
        assert planted.poll() is None and not lay.record("prometheus").exists()
        assert _cli("status", "--root", str(root)).returncode == 3
    finally:
        planted.kill()
        planted.wait(5)


def test_promtool_accepts_the_generated_config_and_target_files(root):
    lay = Layout(stack_dir(root))
    stack.write_config(lay, pushgateway="127.0.0.1:9091")
    register_targets("servesweep", ["127.0.0.1:9464", "10.0.0.2:9464"], {"run_id": "r1"}, root=root)
    register_targets(
        "sglang", ["10.0.0.11:30000"], {"run_id": "r1", "config": "tp4-eagle"}, root=root, key="r1-srv"
    )
    r = subprocess.run(["promtool", "check", "config", str(lay.prom_config)], capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr  # the target files exist and parse
    assert (lay.targets / "sglang-r1-srv.json").exists()
    assert (lay.targets / f"servesweep-r1-{os.getpid()}.json").stat().st_mode & 0o777 == 0o644
    assert not list(lay.targets.glob(".*"))  # no temporary file left behind


@pytest.mark.fast
def test_register_targets_rejects_what_prometheus_would_not_read(root, monkeypatch):
    with pytest.raises(ValueError, match="reads only"):
        register_targets("other", ["127.0.0.1:1"], {"run_id": "r"}, root=root)
    with pytest.raises(ValueError, match="host:port"):
        register_targets("servesweep", ["http://127.0.0.1:1/metrics"], {"run_id": "r"}, root=root)
    with pytest.raises(ValueError, match="label name"):
        register_targets("servesweep", ["127.0.0.1:1"], {"__scheme__": "https"}, root=root)
    with pytest.raises(ValueError, match="key"):
        register_targets("servesweep", ["127.0.0.1:1"], {"run_id": "a/b"}, root=root)
    assert not (root / ".observe" / "targets").exists() or not list((root / ".observe" / "targets").iterdir())
    # The environment names the stack folder for every process and wins over a results root.
    monkeypatch.setenv(stackdir.ENV_DIR, str(root / "elsewhere"))
    p = register_targets("servesweep", [], {"run_id": "r"}, root=root / "ignored")
    assert p.parent == (root / "elsewhere" / "targets").resolve() and json.loads(p.read_text()) == []


@pytest.mark.fast
def test_grafana_provisioning_names_prometheus_and_every_dashboard(root):
    lay = Layout(stack_dir(root))
    paths = stack.provision_grafana(lay, "http://127.0.0.1:19090")
    y = YAML(typ="safe")
    ds = y.load(paths["datasource"].read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == "prometheus"
    assert source["url"] == "http://127.0.0.1:19090"
    (provider,) = y.load(paths["dashboards"].read_text())["providers"]
    dash = Path(provider["options"]["path"])
    assert provider["type"] == "file" and dash.is_absolute()
    expected = sorted(p.name for p in REPO_DASHBOARDS.glob("*.json"))
    assert expected and sorted(p.name for p in dash.glob("*.json")) == expected
    for name in expected:
        assert (dash / name).read_text() == (REPO_DASHBOARDS / name).read_text()
        assert json.loads((dash / name).read_text())["uid"].startswith("servesweep-")
    assert str(lay.grafana / "provisioning") in stack.grafana_hint(lay)


def test_a_backfilled_run_shows_as_history(root):
    start = time.time() - 40 * 86400.0
    run = root / "old-run"
    (run / "c4-p200").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"run_id": "old-run"}))
    real = json.loads((Path(__file__).parents[1] / "results" / "summary_v0_point.json").read_text())
    (run / "c4-p200" / "summary.json").write_text(
        json.dumps({**real, "point_id": "c4-p200", "started_unix": start, "wall_s": 120.0})
    )
    r = _cli("backfill", "--root", str(root), str(run))
    assert r.returncode == 0 and "block(s)" in r.stdout, r.stdout + r.stderr
    port = _free_port()
    _up(root, port)  # Prometheus loads the blocks at start; retention 400d keeps them
    got = _query(f"http://127.0.0.1:{port}", 'servesweep_point_info{run_id="old-run"}', at=start + 60)
    assert [s["metric"]["point_id"] for s in got] == ["c4-p200"]
    assert _cli("down", "--root", str(root)).returncode == 0


FAKE_GRAFANA = """#!{python}
# A stand-in for grafana-server (Grafana is not installable here): answers /api/health on GF_SERVER_HTTP_PORT and
# writes the arguments and GF_* settings it was started with, so the test sees what a real one would be given.
import http.server, json, os, sys
open(os.environ["FAKE_GRAFANA_OUT"], "w").write(json.dumps({{"argv": sys.argv[1:],
    "env": {{k: v for k, v in os.environ.items() if k.startswith("GF_")}}}}))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer((os.environ["GF_SERVER_HTTP_ADDR"], int(os.environ["GF_SERVER_HTTP_PORT"])), H).serve_forever()
"""


def test_grafana_found_is_started_on_the_provisioning_and_stopped_by_down(root, tmp_path, monkeypatch):
    home = tmp_path / "grafana-home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "defaults.ini").write_text("")
    exe = home / "bin" / "grafana-server"
    exe.parent.mkdir()
    exe.write_text(FAKE_GRAFANA.format(python=sys.executable))
    exe.chmod(0o755)
    out = tmp_path / "grafana-args.json"
    monkeypatch.setenv("FAKE_GRAFANA_OUT", str(out))
    port, gport = _free_port(), _free_port()
    r = _cli(
        "up", "--root", str(root), "--port", str(port), "--grafana", str(exe), "--grafana-port", str(gport)
    )
    assert r.returncode == 0 and "started: prometheus, grafana" in r.stdout, r.stdout + r.stderr
    assert f"http://127.0.0.1:{gport}/d/servesweep-live" in r.stdout
    got = json.loads(out.read_text())
    lay = Layout(stack_dir(root))
    assert got["argv"] == ["--homepath", str(home.resolve())]
    assert got["env"]["GF_PATHS_PROVISIONING"] == str(lay.grafana / "provisioning")
    assert got["env"]["GF_SERVER_HTTP_PORT"] == str(gport)
    r = _cli("down", "--root", str(root))
    assert r.returncode == 0 and "stopped: grafana, prometheus" in r.stdout, r.stdout
    assert not lay.record("grafana").exists() and not lay.record("prometheus").exists()


@pytest.mark.fast
def test_a_killed_owners_target_files_are_swept_and_no_other(root):
    """Stale targets do not pile up: a file whose writer is gone (here: this pid with another start time, as after
    a SIGKILL and pid reuse) is removed by the next registration and by list_targets; a live owner's, another
    host's and an ownerless (hand-written) file stay; the owner stamp is not shown as a label."""
    tdir = Layout(stack_dir(root)).targets

    def write(name: str, owner: str | None) -> Path:
        labels = {"run_id": name, **({stackdir.OWNER_LABEL: owner} if owner else {})}
        path = tdir / f"servesweep-{name}.json"
        path.write_text(json.dumps([{"targets": ["127.0.0.1:1"], "labels": labels}]))
        return path

    live = register_targets("servesweep", ["127.0.0.1:2"], {"run_id": "live"}, root=root)
    host, pid, started = stackdir.owner_stamp().rsplit(":", 2)
    dead = write("dead", f"{host}:{pid}:{float(started) - 100:.2f}")
    elsewhere = write("elsewhere", f"other-host:{pid}:1.00")
    by_hand = write("by-hand", None)
    rows = stackdir.list_targets(root)
    assert not dead.exists() and live.exists() and elsewhere.exists() and by_hand.exists()
    assert {r["labels"]["run_id"] for r in rows} == {"live", "elsewhere", "by-hand"}
    assert all(stackdir.OWNER_LABEL not in r["labels"] for r in rows)
    dead = write("dead", f"{host}:{pid}:{float(started) - 100:.2f}")
    register_targets("sglang", ["127.0.0.1:3"], {"run_id": "next"}, root=root)
    assert not dead.exists()

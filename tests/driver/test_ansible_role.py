"""The sglang_server role through real ansible-runner runs on localhost, with the emulator as the server
(process launcher), plus the systemd and docker launchers rendered in check mode and ansible-lint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support import with_server_argv

from servesweep.driver.ansible import ansible_dir, local_inventory, run_playbook

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3.6-27B"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Server:
    """Applies the role for one port and work dir; always stops what it started."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.port = _free_port()
        self.workdir = tmp / "server"
        self.results = tmp / "results"
        self.n = 0

    def vars(self, **over) -> dict:
        v = {
            "sglang_server_state": "started",
            "sglang_server_version": "0.5.23",
            "sglang_server_model_path": MODEL,
            "sglang_server_port": self.port,
            "sglang_server_python": sys.executable,
            "sglang_server_emulator": True,
            "sglang_server_sim_gpu": "H200",
            "sglang_server_workdir": str(self.workdir),
            "sglang_server_results_dir": str(self.results),
            "sglang_server_startup_timeout": 120,
            "sglang_server_stop_timeout": 20,
            "sglang_server_gather_facts": False,
        }
        v.update(over)
        return v

    def apply(self, check: bool = False, **over):
        """The role with these variables and the command line the orchestrator would build from them
        (tests/support.with_server_argv); `sglang_server_command` here is a generic server's argv template."""
        self.n += 1
        command = over.pop("sglang_server_command", None)
        return run_playbook(
            "sglang_server.yml",
            inventory=local_inventory(),
            extravars=with_server_argv(self.vars(**over), command=command, sim_args={"sim_load_time": 0.2}),
            artifact_dir=self.tmp / "artifacts",
            ident=f"t{self.n}",
            check=check,
            diff=check,
            timeout_s=300,
        )

    def pid(self) -> int | None:
        try:
            return int((self.workdir / "server.pid").read_text())
        except (OSError, ValueError):
            return None

    def cleanup(self) -> None:
        pid = self.pid()
        try:
            if pid and _alive(pid):
                self.apply(sglang_server_state="stopped")
        finally:
            pid = self.pid()
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


def test_restart_between_configurations_readiness_idempotence_and_verification(server):
    a = server.apply(sglang_server_flags={"tp_size": 1, "context_length": 4096})
    assert a.ok, a.error()
    pid_a = server.pid()
    info = a.artifact_data["sglang_server"]
    assert info["server_info"]["tp_size"] == 1 and info["models"]["data"][0]["max_model_len"] == 4096
    assert info["ready"]["health_after_s"] is not None and info["model_info"]["model_path"] == MODEL
    assert info["mismatches"] == [] and info["pid"] == str(pid_a)
    saved = json.loads((server.results / "server_info.json").read_text())
    assert saved["server_info"]["tp_size"] == 1
    assert "ready to roll" in (server.results / "server.log").read_text()

    b = server.apply(sglang_server_flags={"tp_size": 2, "context_length": 8192, "max_running_requests": 16})
    assert b.ok, b.error()
    pid_b = server.pid()
    assert pid_b != pid_a and not _alive(pid_a)  # the whole old process group is gone
    live = _get(f"http://127.0.0.1:{server.port}/server_info")
    assert live["tp_size"] == 2
    assert _get(f"http://127.0.0.1:{server.port}/v1/models")["data"][0]["max_model_len"] == 8192

    # the same configuration again: nothing changes, no restart
    again = server.apply(
        sglang_server_flags={"tp_size": 2, "context_length": 8192, "max_running_requests": 16}
    )
    assert again.ok, again.error()
    assert server.pid() == pid_b
    assert again.stats["changed"].get("localhost", 0) == 0, again.stats

    # a server that is not what was asked fails clearly (here: a fork that would report another tp size)
    bad = server.apply(
        sglang_server_flags={"tp_size": 2, "context_length": 8192, "max_running_requests": 16},
        sglang_server_expect={"tp_size": 4, "context_length": 16384},
    )
    assert not bad.ok
    err = bad.error()
    assert "verification failed" in err
    assert "tp_size: asked 4, server reports 2" in err
    assert "context_length: asked 16384, /v1/models max_model_len is 8192" in err


def test_server_that_exits_at_start_has_its_log_captured(server):
    t0 = time.monotonic()
    r = server.apply(sglang_server_flags={"tp_size": 1, "no_such_flag": 3}, sglang_server_startup_timeout=900)
    took = time.monotonic() - t0
    assert not r.ok
    assert (
        took < 300
    )  # it noticed the exit; it did not wait out the 900 s startup bound (margin for a loaded box)
    log = (server.results / "server.log").read_text()
    assert "unrecognized arguments: --no-such-flag 3" in log
    assert "the server process exited before /health answered 200" in r.error()
    assert "server log: " + str(server.results / "server.log") in r.error()


# A generic server that ignores SIGTERM and spawns a child in its group that does too: only the role's SIGKILL of
# the whole group (after the bounded graceful wait) ends them.
STUBBORN = """
import http.server, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])
open('child.pid', 'w').write(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'ok')
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


def test_a_group_that_ignores_sigterm_is_killed_and_a_stop_writes_nothing(server):
    stub = server.tmp / "stubborn.py"
    stub.write_text(STUBBORN)
    generic = {
        "sglang_server_command": ["{python}", str(stub), "{port}"],
        "sglang_server_verify": False,
        "sglang_server_stop_timeout": 2,
    }
    a = server.apply(**generic)
    assert a.ok, a.error()
    pid = server.pid()
    child = int((server.workdir / "child.pid").read_text())
    assert pid and _alive(pid) and _alive(child) and os.getpgid(child) == pid
    (server.workdir / "launch.sh").unlink()  # a stop renders no launch script
    t0 = time.monotonic()
    b = server.apply(sglang_server_state="stopped", **generic)
    assert b.ok, b.error()
    assert time.monotonic() - t0 < 60
    deadline = time.monotonic() + 10
    while (_alive(pid) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid) and not _alive(child)  # SIGKILLed, the whole group
    assert not (server.workdir / "server.pid").exists() and not (server.workdir / "launch.sh").exists()
    assert b.stats["changed"].get("localhost", 0) == 1, b.stats
    again = server.apply(sglang_server_state="stopped", **generic)  # nothing recorded is alive: nothing to do
    assert again.ok and again.stats["changed"].get("localhost", 0) == 0, again.stats


def test_a_port_held_by_a_stranger_is_refused_and_the_stranger_lives(server):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", server.port))
        stranger.listen()
        r = server.apply(sglang_server_flags={"tp_size": 1})
        assert not r.ok
        err = r.error()
        assert f"port {server.port} on localhost is held by a process this role did not start" in err, err
        assert "failed in task 'Stop the recorded server and start the new one" in err, err
        assert server.pid() is None  # nothing started, nothing recorded
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass  # the stranger still holds it


def _rendered(r, task: str) -> str:
    out = []
    for ev in r_events(r):
        data = ev.get("event_data") or {}
        if ev.get("event") == "runner_on_ok" and data.get("task") == task:
            diff = (data.get("res") or {}).get("diff") or []
            for d in diff if isinstance(diff, list) else [diff]:
                out.append(str(d.get("after", "")))
    return "\n".join(out)


def r_events(r):
    for f in sorted((r.artifact_dir / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-")[0])):
        yield json.loads(f.read_text())


@pytest.mark.parametrize("launcher", ["systemd", "docker"])
def test_systemd_and_docker_render_version_aware_commands_in_check_mode(tmp_path, launcher, monkeypatch):
    s = Server(tmp_path)
    flags = {
        "tp_size": 2,
        "mamba_radix_cache_strategy": "extra_buffer",
        "cuda_graph_max_bs_decode": 32,
        "speculative_algorithm": "NEXTN",
        "enable_metrics": True,
        "disable_radix_cache": False,
    }
    monkeypatch.setenv("SERVESWEEP_TEST_KEY", "sk-test-secret-123")  # the controller's env, read by the role
    texts = {}
    for version in ("0.5.11", "0.5.23"):
        r = s.apply(
            check=True,
            sglang_server_launcher=launcher,
            sglang_server_emulator=False,
            sglang_server_python="/opt/sglang/bin/python",
            sglang_server_version=version,
            sglang_server_flags=flags,
            sglang_server_env={"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_HEALTH_CHECK_TIMEOUT": "120"},
            sglang_server_unit_dir=str(tmp_path / "units"),
            sglang_server_api_key_env="SERVESWEEP_TEST_KEY",
        )
        assert r.ok, r.error()
        task = "Write the systemd unit" if launcher == "systemd" else "Write the docker run script"
        texts[version] = _rendered(r, task)
        assert texts[version], f"no diff for {task}"
        # nothing was applied in check mode, and the key never reached an event or the rendered text
        assert not (tmp_path / "units").exists() and not s.workdir.exists()
        blob = "".join(p.read_text() for p in (r.artifact_dir / "job_events").glob("*.json"))
        assert "sk-test-secret-123" not in blob
    old, new = texts["0.5.11"], texts["0.5.23"]
    assert "--mamba-scheduler-strategy extra_buffer" in old and "--cuda-graph-max-bs 32" in old
    assert "--mamba-radix-cache-strategy extra_buffer" in new and "--cuda-graph-max-bs-decode 32" in new
    assert "mamba-scheduler" not in new
    assert "SGLANG_ENABLE_SPEC_V2=1" in old and "SGLANG_ENABLE_SPEC_V2" not in new  # removed after 0.5.12
    for t in (old, new):
        assert "SGLANG_HEALTH_CHECK_TIMEOUT=120" in t
        assert "--speculative-algorithm NEXTN --tp-size 2" in t and "--enable-metrics" in t
        assert "--disable-radix-cache" not in t
        # the key travels in a 0600 config file, never on the server's command line (/proc/<pid>/cmdline)
        assert "--api-key" not in t and "--config" in t and "secret.yaml" in t
    if launcher == "systemd":
        assert "ExecStart=/opt/sglang/bin/python -m sglang.launch_server --model-path Qwen/Qwen3.6-27B" in new
        assert f"--port {s.port}" in new and "KillMode=control-group" in new
    else:
        assert "docker run --detach --name servesweep-sglang" in new
        assert "--gpus all --ipc=host" in new and f"-p 127.0.0.1:{s.port}:{s.port}" in new
        assert "lmsysorg/sglang:v0.5.23" in new and "lmsysorg/sglang:v0.5.11" in old
        assert "--host 0.0.0.0" in new  # inside the container


def test_ansible_lint_is_clean():
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-lint"), "--offline", str(ansible_dir())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "profile 'production'" in r.stderr + r.stdout or "production" in r.stderr + r.stdout


@pytest.mark.parametrize("launcher", ["systemd", "docker"])
def test_a_generic_server_template_renders_for_systemd_and_docker_in_check_mode(
    tmp_path, launcher, monkeypatch
):
    """A non-SGLang server (vLLM here): the template's placeholders filled in, the flags under their own names
    (no SGLang renames), the key reaching the server through its own variable from a 0600 file, never argv."""
    s = Server(tmp_path)
    monkeypatch.setenv("SERVESWEEP_TEST_KEY", "sk-test-secret-456")
    r = s.apply(
        check=True,
        sglang_server_launcher=launcher,
        sglang_server_emulator=False,
        sglang_server_python="/opt/vllm/bin/python",
        sglang_server_version="",
        sglang_server_command=[
            "{python}",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "{model_path}",
            "--served-model-name",
            "{served_model_name}",
            "--host",
            "{host}",
            "--port",
            "{port}",
        ],
        sglang_server_flags={
            "cuda_graph_max_bs_decode": 32,  # an SGLang rename: not applied to a generic server
            "enable_prefix_caching": True,
            "enforce_eager": False,
            "compilation_config": {"level": 3},
            "allowed_origins": ["a", "b"],
        },
        sglang_server_env={"SGLANG_ENABLE_SPEC_V2": "1"},  # not filtered by an SGLang version
        sglang_server_server_api_key_env="VLLM_API_KEY",
        sglang_server_docker_image="vllm/vllm-openai:v0.11.0",
        sglang_server_unit_dir=str(tmp_path / "units"),
        sglang_server_api_key_env="SERVESWEEP_TEST_KEY",
    )
    assert r.ok, r.error()
    task = "Write the systemd unit" if launcher == "systemd" else "Write the docker run script"
    t = _rendered(r, task)
    host = "127.0.0.1" if launcher == "systemd" else "0.0.0.0"
    head = "/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3.6-27B"
    assert f"{head} --served-model-name Qwen/Qwen3.6-27B --host {host} --port {s.port}" in t, t
    assert "--allowed-origins a b" in t and "--compilation-config '{\"level\": 3}'" in t
    assert "--cuda-graph-max-bs-decode 32" in t and "--enable-prefix-caching" in t and "enforce" not in t
    assert "SGLANG_ENABLE_SPEC_V2=1" in t
    assert "sk-test-secret-456" not in t and "--api-key" not in t and "--config" not in t
    if launcher == "systemd":
        assert f"EnvironmentFile={s.workdir}/secret.env" in t
        assert "Description=server /opt/vllm/bin/python -m vllm.entrypoints.openai.api_server (" in t
    else:
        assert f"--env-file {s.workdir}/secret.env" in t and "vllm/vllm-openai:v0.11.0" in t
        assert "/run/servesweep/secret.key:ro" in t
    blob = "".join(p.read_text() for p in (r.artifact_dir / "job_events").glob("*.json"))
    assert "sk-test-secret-456" not in blob

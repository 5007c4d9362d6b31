"""Start an emulator process from Python (tests, the load generator, demos) and stop it cleanly.

    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--enable-metrics"]) as sim:
        requests.get(sim.base_url + "/v1/models")

The emulator runs as `python -m servesweep.sim` in its own process group (session), on a free port, and
`start_sim` returns once `/health` answers 200. `stop()` sends SIGTERM to the group (the emulator flushes its
ground truth and exits), then SIGKILL if it lingers. It does not outlive the process that started it (a SIGKILLed
test session or `servesweep load`): servesweep.processes watches that process for it.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..net import free_port
from ..processes import Group, answers_200, start_group, stop_group
from ..processes import wait_ready as wait_group_ready
from .groundtruth import read_ground_truth


class SimProcess:
    def __init__(self, group: Group, host: str, port: int, ground_truth: Path | None, log_path: Path):
        self.group = group
        self.proc = group.popen
        self.host = host
        self.port = port
        self.ground_truth_path = ground_truth
        self.log_path = log_path
        self.base_url = f"http://{host}:{port}"

    @property
    def pid(self) -> int:
        return self.group.pid

    def read_ground_truth(self) -> list[dict]:
        """Every ground-truth line written so far (the emulator flushes at least once a second and at exit)."""
        if self.ground_truth_path is None:
            raise RuntimeError("this emulator was started without ground_truth=")
        return read_ground_truth(self.ground_truth_path)

    def ground_truth_so_far(self, timeout: float = 15.0) -> list[dict]:
        """Every ground-truth line of the requests that ended before this call, with the emulator still running.
        Lines are flushed in order about once a second: one more request (a barrier, left out of the answer) and a
        wait for its line, instead of sleeping through a flush period and hoping."""
        import json
        import uuid

        mark = f"gt-barrier-{uuid.uuid4().hex}"
        with urllib.request.urlopen(self.base_url + "/v1/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        req = urllib.request.Request(
            self.base_url + "/v1/completions",
            data=json.dumps({"model": model, "prompt": "barrier", "max_tokens": 1}).encode(),
            headers={"Content-Type": "application/json", "X-Request-Id": mark},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        deadline = time.monotonic() + timeout
        while True:
            got = self.read_ground_truth()
            if any(d.get("id") == mark for d in got):
                return [d for d in got if d.get("id") != mark]
            if time.monotonic() > deadline:
                raise RuntimeError(f"the emulator's ground truth lacks the barrier request after {timeout} s")
            time.sleep(0.05)

    def stop_and_read_ground_truth(self, timeout: float = 5.0) -> list[dict]:
        """Stop the emulator and return its whole ground truth: it writes every buffered line at exit, so this
        needs no wait for the once-a-second flush (a test asks for this instead of sleeping past a flush)."""
        code = self.stop(timeout)
        if code not in (0, -signal.SIGTERM):
            raise RuntimeError(f"the emulator exited with {code}; its ground truth may be incomplete:\n"
                               f"{self.log_text()[-2000:]}")  # fmt: skip
        return self.read_ground_truth()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the process group, wait up to `timeout`, then SIGKILL what is left. Returns the exit code."""
        return stop_group(self.group, timeout)

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_sim(
    args: list[str],
    *,
    port: int | None = None,
    ground_truth: Path | str | None = None,
    env: dict[str, str] | None = None,
    log_path: Path | str | None = None,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
    wait_ready: bool = True,
    python: str | None = None,
    prefix: list[str] | None = None,
) -> SimProcess:
    """Start `python -m servesweep.sim ARGS --host HOST --port PORT` and wait until `/health` is 200.

    `ground_truth` adds `--sim-ground-truth PATH`. `env` is added to the current environment (SGL_FORCE_SHUTDOWN=1
    unless `env` sets it: `stop()` then ends streams at once instead of draining them). Output goes to
    `log_path` (a temporary file when omitted). `prefix` runs the command under e.g. `["taskset", "-c", "0"]`.
    Raises RuntimeError with the log's tail when the process exits or does not get ready within `timeout`.
    """
    port = port or free_port(host)
    cmd = [
        *(prefix or []),
        python or sys.executable,
        "-m",
        "servesweep.sim",
        *args,
        "--host",
        host,
        "--port",
        str(port),
    ]
    gt = None
    if ground_truth is not None:
        gt = Path(ground_truth)
        cmd += ["--sim-ground-truth", str(gt)]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="servesweep-sim-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    full_env = dict(os.environ)
    # stop() should be prompt: skip SGLang's drain-on-SIGTERM unless the caller asks for it (env SGL_FORCE_SHUTDOWN="")
    full_env.setdefault("SGL_FORCE_SHUTDOWN", "1")
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    group = start_group(cmd, env=full_env, log_path=log_path, kind="emulator", watch_parent=True)
    sim = SimProcess(group, host, port, gt, log_path)
    if wait_ready:
        # A probe of its own, not servesweep.target.http: the emulator imports nothing of the load generator.
        url = sim.base_url + "/health"
        wait_group_ready(group, lambda: answers_200(url), timeout, "emulator", detail=f": {cmd}", poll_s=0.02)
    return sim

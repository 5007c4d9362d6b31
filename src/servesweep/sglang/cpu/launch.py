"""Start real SGLang on this machine's CPU with the tiny model, and stop it with everything it started.

    with start_server({"max_running_requests": 2}) as srv:
        requests.get(srv.base_url + "/get_server_info")

`start_server` runs `<SGLang venv python> -m sglang.launch_server` in its own session (process group) on a
free port, with `server_env()` (SGLANG_USE_CPU_ENGINE=1, the `sgl_kernel` stand-in first on PYTHONPATH,
offline Hugging Face), and returns once `/health` answers 200 (24-30 s on 2 cores, mostly imports). `stop()`
sends SIGTERM to that group (SGLang's launcher stops its scheduler and detokenizer, 3-7 s), then SIGKILL to the
group if anything lingers. The launcher also gets PR_SET_PDEATHSIG, so it is told to stop if its parent dies
without stopping it; SGLang's own children watch their parent the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ...net import free_port
from ..flags import render_argv
from . import env as cpu_env

# The flags every CPU server gets, by ServerArgs field (rendered with SGLang's own flag table). Why each:
BASE_FLAGS: dict[str, Any] = {
    "device": "cpu",
    # every other attention backend needs CUDA or the AMX extension
    "attention_backend": "torch_native",
    # no CUDA graphs on a CPU (the replacement of the deprecated --disable-cuda-graph)
    "cuda_graph_backend_decode": "disabled",
    "cuda_graph_backend_prefill": "disabled",
    # the KV pool from a fixed token count, not from a fraction of (absent) GPU memory
    "mem_fraction_static": 0.1,
    "max_total_tokens": 16384,
    "context_length": 4096,
    "enable_metrics": True,
}
DEFAULT_PORT = 30000


def server_env(record: Path | str | None = None) -> dict[str, str]:
    """The variables the SGLang process needs on top of the caller's environment."""
    env = {
        # SGLang's CPU engine (the torch CPU paths and the sgl_kernel CPU helpers)
        "SGLANG_USE_CPU_ENGINE": "1",
        # the pure-torch sgl_kernel stand-in (stand_in/sgl_kernel/__init__.py says what it replaces and why)
        "PYTHONPATH": str(cpu_env.STAND_IN_DIR),
        # the model is a local folder: nothing may reach for the network
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if record is not None:
        env["SERVESWEEP_SGL_KERNEL_RECORD"] = str(record)
    return env


def flags_for(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """BASE_FLAGS with `overrides` (ServerArgs fields) on top; a None value removes a base flag."""
    flags = {**BASE_FLAGS, **(overrides or {})}
    return {k: v for k, v in flags.items() if v is not None}


def server_argv(
    model: Path | str, flags: dict[str, Any], *, host: str, port: int, python: Path | str | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    return [
        str(python or cpu_env.venv_python()), "-m", "sglang.launch_server", "--model-path", str(model),
        *render_argv(flags, cpu_env.SGLANG_VERSION), *(extra_args or []), "--host", host, "--port", str(port),
    ]


class ServerProcess:
    """One SGLang server this process started: its launcher's Popen, address, flags and log."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, flags: dict[str, Any], argv: list[str],
                 log_path: Path, started_s: float):
        self.proc = proc
        self.host = host
        self.port = port
        self.flags = flags
        self.argv = argv
        self.log_path = log_path
        self.base_url = f"http://{host}:{port}"
        self.start_seconds = started_s

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the server's process group, wait up to `timeout`, then SIGKILL the group. Returns the
        launcher's exit code. Only this group is signalled: it is the session this object started."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # the launcher is gone (or did not stop in time): nothing of its group may survive it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGTERM the launcher when the process that started it dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def start_server(
    flags: dict[str, Any] | None = None,
    *,
    model: Path | str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | str | None = None,
    env: dict[str, str] | None = None,
    record: Path | str | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 240.0,
    wait_ready: bool = True,
) -> ServerProcess:
    """Start SGLang with `flags_for(flags)` and wait until `/health` is 200.

    `model`: a model folder (default: the tiny model, built if missing; the venv is installed if missing).
    `extra_args`: SGLang argv words after the rendered flags. `log_path` "-": the server writes to this
    process's stdout and stderr (a foreground `serve`); None: a temp file.
    `env` is added on top of the caller's environment and `server_env(record)`. Raises RuntimeError with the
    log's tail when the server exits or is not ready within `timeout`."""
    python = cpu_env.ensure_installed()
    model = Path(model) if model is not None else cpu_env.ensure_model()
    port = port or free_port(host)
    merged = flags_for(flags)
    argv = server_argv(model, merged, host=host, port=port, python=python, extra_args=extra_args)
    inherit = log_path == "-"
    if inherit:
        log_path = os.devnull
    elif log_path is None:
        fd, name = tempfile.mkstemp(prefix="servesweep-sglang-cpu-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    full_env = {**os.environ, **server_env(record), **(env or {})}
    for name in ("VIRTUAL_ENV", "PYTHONHOME"):  # the caller's venv must not leak into SGLang's
        full_env.pop(name, None)
    t0 = time.monotonic()
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            argv, stdout=None if inherit else logf, stderr=None if inherit else subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
    srv = ServerProcess(proc, host, port, merged, argv, log_path, 0.0)
    if not wait_ready:
        return srv
    try:
        wait_healthy(srv, timeout)
    except BaseException:
        srv.stop()
        raise
    srv.start_seconds = time.monotonic() - t0
    return srv


def wait_healthy(srv: ServerProcess, timeout: float) -> None:
    """Poll `/health` until 200; RuntimeError with the log's tail if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout
    url = srv.base_url + "/health"
    while True:
        rc = srv.proc.poll()
        if rc is not None:
            raise RuntimeError(
                f"SGLang exited with code {rc} before getting ready: {' '.join(srv.argv)}\n"
                f"--- {srv.log_path} (tail) ---\n{_tail(srv.log_text())}"
            )
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"SGLang not ready within {timeout:g} s: {' '.join(srv.argv)}\n"
                f"--- {srv.log_path} (tail) ---\n{_tail(srv.log_text())}"
            )
        time.sleep(0.25)


def _tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])

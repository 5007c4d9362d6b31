"""Start real SGLang on this machine's CPU with the tiny model, and stop it with everything it started.

    with start_server({"max_running_requests": 2}) as srv:
        requests.get(srv.base_url + "/get_server_info")

`start_server` runs `<SGLang venv python> -m sglang.launch_server` in its own session (process group) on a
free port, with `server_env()` (SGLANG_USE_CPU_ENGINE=1, the `sgl_kernel` stand-in first on PYTHONPATH,
offline Hugging Face), and returns once `/health` answers 200 (24-30 s on 2 cores, mostly imports). `stop()`
sends SIGTERM to that group (SGLang's launcher stops its scheduler and detokenizer, 3-7 s), then SIGKILL to the
group if anything lingers. The group does not outlive the process that started it, however that process ends:
servesweep.processes watches it (`start_group(watch_parent=True)`; why not PR_SET_PDEATHSIG is said there).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ...net import free_port
from ...processes import Group, answers_200, start_group, stop_group
from ...processes import wait_ready as wait_group_ready
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
    model: Path | str,
    flags: dict[str, Any],
    *,
    host: str,
    port: int,
    python: Path | str | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    return [
        str(python or cpu_env.venv_python()),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        *render_argv(flags, cpu_env.SGLANG_VERSION),
        *(extra_args or []),
        "--host",
        host,
        "--port",
        str(port),
    ]


class ServerProcess:
    """One SGLang server this process started: its launcher's process group, address, flags and log."""

    def __init__(
        self,
        group: Group,
        host: str,
        port: int,
        flags: dict[str, Any],
        argv: list[str],
        log_path: Path,
        started_s: float,
    ):
        self.group = group
        self.proc = group.popen
        self.host = host
        self.port = port
        self.flags = flags
        self.argv = argv
        self.log_path = log_path
        self.base_url = f"http://{host}:{port}"
        self.start_seconds = started_s

    @property
    def pid(self) -> int:
        return self.group.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the server's process group, wait up to `timeout`, then SIGKILL what is left. Returns the
        launcher's exit code. Only this group is signalled: it is the session this object started."""
        return stop_group(self.group, timeout, kill_wait_s=10.0)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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
    group = start_group(argv, env=full_env, log_path=None if inherit else log_path, kind="sglang-cpu",
                        watch_parent=True)  # fmt: skip
    srv = ServerProcess(group, host, port, merged, argv, log_path, 0.0)
    if wait_ready:
        srv.start_seconds = wait_healthy(srv, timeout)
    return srv


def wait_healthy(srv: ServerProcess, timeout: float) -> float:
    """Poll `/health` until 200 (the seconds it took); RuntimeError with the log's tail if the server exits or the
    time runs out (the server is then stopped)."""
    url = srv.base_url + "/health"
    return wait_group_ready(
        srv.group, lambda: answers_200(url, timeout_s=5), timeout, "SGLang", detail=f": {' '.join(srv.argv)}",
        poll_s=0.25, stop_grace_s=30.0,
    )  # fmt: skip

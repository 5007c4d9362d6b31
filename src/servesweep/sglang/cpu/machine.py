"""Real SGLang on this machine's CPU: its venv installed and the tiny model built (`env.py`, reported through a log
callback), an experiment template filled in with this machine's paths, and the server served in the foreground.
What `servesweep sglang-cpu install|model|experiment|serve` runs (servesweep.cli.sglang_cpu; docs/sglang-cpu.md).
A step that cannot be done raises servesweep.exit_codes.CommandError."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from servesweep.exit_codes import CommandError

from . import env as cpu_env

# Placeholders of examples/sglang-cpu*.yaml: an experiment names the interpreter and the model by absolute path
# (the role runs them on the host as given), and those live in this machine's cache folder.
PLACEHOLDERS = {
    "@SGLANG_CPU_PYTHON@": lambda: str(cpu_env.venv_python()),
    "@SGLANG_CPU_MODEL@": lambda: str(cpu_env.model_dir()),
    "@SGLANG_CPU_STAND_IN@": lambda: str(cpu_env.STAND_IN_DIR),
}

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


def install(log: Log = _stderr, *, force: bool = False) -> Path:
    """SGLang's venv (pinned; rebuilt when the pins change, or with `force`): its python."""
    # a matching stamp is written only after the import check passed, so an installed venv costs no check here
    try:
        return cpu_env.ensure_installed(log, force=force)
    except cpu_env.InstallError as e:
        raise CommandError(f"SGLang's CPU venv could not be installed: {e}") from None


def model(log: Log = _stderr) -> Path:
    """The tiny model's folder, built first if missing."""
    try:
        return cpu_env.ensure_model(log)
    except cpu_env.InstallError as e:
        raise CommandError(f"the tiny model could not be built: {e}") from None


def render_experiment(text: str, log: Log = _stderr) -> str:
    """`text` with the placeholders replaced by this machine's paths (venv installed, model built first)."""
    install(log)
    model(log)
    for key, value in PLACEHOLDERS.items():
        text = text.replace(key, value())
    return text


def serve(host: str, port: int, startup_timeout: float, sglang_args: list[str], log: Log = _stderr) -> None:
    """Real SGLang with the tiny model in the foreground until Ctrl-C or SIGTERM, which stop it and its children
    (then this returns); `sglang_args` are added to the CPU flags."""
    from . import local_server

    install(log)
    tiny = model(log)
    # Ctrl-C and SIGTERM both stop the server (the finally block below). SIGINT is set explicitly: a shell
    # starting this command in the background leaves SIGINT ignored, and Python then never raises on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    srv = local_server.start_server(
        model=tiny, host=host, port=port, extra_args=sglang_args, log_path="-",
        timeout=startup_timeout, wait_ready=False,
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        try:
            local_server.wait_healthy(srv, startup_timeout)
        except RuntimeError as e:
            raise CommandError(str(e)) from None
        log(f"SGLang {cpu_env.SGLANG_VERSION} on CPU ready at {srv.base_url} in {time.monotonic() - t0:.0f} s "
            f"(model {tiny}); Ctrl-C stops it")  # fmt: skip
        while srv.alive():
            time.sleep(0.5)
        raise CommandError(f"SGLang exited with code {srv.proc.returncode}")
    except KeyboardInterrupt:
        log("stopping SGLang ...")
    finally:
        rc = srv.stop()
        log(f"SGLang stopped (exit {rc})")

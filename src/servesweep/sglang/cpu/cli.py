"""`servesweep sglang-cpu`: install SGLang's CPU venv, build the tiny model, serve real SGLang on this CPU, or
write an experiment file for it.

    servesweep sglang-cpu install            # SGLang 0.5.23's venv under $SERVESWEEP_CACHE_DIR (2-4 min once)
    servesweep sglang-cpu model              # the tiny model's folder (built offline in ~10 s once)
    servesweep sglang-cpu serve [--port P] [-- SGLANG FLAGS]   # foreground; Ctrl-C stops it and its children
    servesweep sglang-cpu experiment examples/sglang-cpu.yaml -o my.yaml   # fill in this machine's paths
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from . import env as cpu_env

# Placeholders of examples/sglang-cpu*.yaml: an experiment names the interpreter and the model by absolute path
# (the role runs them on the host as given), and those live in this machine's cache folder.
PLACEHOLDERS = {
    "@SGLANG_CPU_PYTHON@": lambda: str(cpu_env.venv_python()),
    "@SGLANG_CPU_MODEL@": lambda: str(cpu_env.model_dir()),
    "@SGLANG_CPU_STAND_IN@": lambda: str(cpu_env.STAND_IN_DIR),
}


def _log(msg: str) -> None:
    click.echo(msg, err=True)


def _install() -> Path:
    try:
        return cpu_env.ensure_installed(_log)
    except cpu_env.InstallError as e:
        raise click.ClickException(f"SGLang's CPU venv could not be installed: {e}") from None


def _model() -> Path:
    try:
        return cpu_env.ensure_model(_log)
    except cpu_env.InstallError as e:
        raise click.ClickException(f"the tiny model could not be built: {e}") from None


def render_experiment(text: str) -> str:
    """`text` with the placeholders replaced by this machine's paths (venv installed, model built first)."""
    _install()
    _model()
    for key, value in PLACEHOLDERS.items():
        text = text.replace(key, value())
    return text


@click.group("sglang-cpu")
def command():
    """Real SGLang on this machine's CPU with a tiny offline model (no GPU): see docs/sglang-cpu.md."""


@command.command("install")
@click.option("--force", is_flag=True, help="rebuild even if the stamp matches the pins")
def install_cmd(force: bool):
    """Install SGLang's venv (pinned; rebuilt when the pins change) and print its python."""
    # a matching stamp is written only after the import check passed, so an installed venv costs no check here
    try:
        py = cpu_env.ensure_installed(_log, force=force)
    except cpu_env.InstallError as e:
        raise click.ClickException(f"SGLang's CPU venv could not be installed: {e}") from None
    click.echo(str(py))


@command.command("model")
def model_cmd():
    """Build the tiny model (if missing) and print its folder."""
    click.echo(str(_model()))


@command.command("experiment")
@click.argument("template", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="the experiment file to write")
def experiment_cmd(template: Path, out: Path):
    """Write TEMPLATE (e.g. examples/sglang-cpu.yaml) with this machine's SGLang python and model filled in."""
    text = render_experiment(template.read_text())
    out.write_text(text)
    click.echo(str(out))


@command.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=30000, show_default=True, type=int)
@click.option("--startup-timeout", default=300.0, show_default=True, type=float, help="seconds")
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(host: str, port: int, startup_timeout: float, sglang_args: tuple[str, ...]):
    """Start real SGLang with the tiny model in the foreground; Ctrl-C (or SIGTERM) stops it and its children.

    SGLANG_ARGS after `--` are added to the CPU flags (e.g. `-- --max-running-requests 2`)."""
    from . import launch

    _install()
    model = _model()
    # Ctrl-C and SIGTERM both stop the server (the finally block below). SIGINT is set explicitly: a shell
    # starting this command in the background leaves SIGINT ignored, and Python then never raises on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    srv = launch.start_server(
        model=model, host=host, port=port, extra_args=list(sglang_args), log_path="-",
        timeout=startup_timeout, wait_ready=False,
    )
    try:
        t0 = time.monotonic()
        try:
            launch.wait_healthy(srv, startup_timeout)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from None
        _log(f"SGLang {cpu_env.SGLANG_VERSION} on CPU ready at {srv.base_url} in {time.monotonic() - t0:.0f} s "
             f"(model {model}); Ctrl-C stops it")
        while srv.alive():
            time.sleep(0.5)
        raise click.ClickException(f"SGLang exited with code {srv.proc.returncode}")
    except KeyboardInterrupt:
        _log("stopping SGLang ...")
    finally:
        rc = srv.stop()
        _log(f"SGLang stopped (exit {rc})")
    sys.exit(0)

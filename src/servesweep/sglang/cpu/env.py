"""SGLang's own virtual environment for the CPU tier: where it lives, whether it is installed, how it is built.

Layout (every path under `cache_dir()`, i.e. `$SERVESWEEP_CACHE_DIR`, default `$XDG_CACHE_HOME/servesweep` or `~/.cache/servesweep`):

    sglang-cpu/venv/                                   SGLang 0.5.23 and its pins (requirements.txt)
    sglang-cpu/venv/.servesweep-requirements.sha256    stamp: sha256 of requirements.txt + the sglang pin
    sglang-cpu/.install.lock                           fcntl lock held while installing or checking

The venv counts as installed only when the stamp holds `pins_digest()`, so editing requirements.txt or
`SGLANG_PIN` rebuilds it. A build goes to a temp folder beside the venv and is renamed into place once it
imports, under the lock: two processes never see a half-installed venv, and a failed build leaves the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from servesweep.files import cache_root

# sglang itself goes in with --no-deps: its wheel declares CUDA-only requirements (flashinfer, sglang-kernel,
# nvidia-*) that do not install or do not import on a CPU machine; requirements.txt holds what it really needs.
SGLANG_PIN = "sglang==0.5.23"
SGLANG_VERSION = SGLANG_PIN.split("==", 1)[1]
STAMP_NAME = ".servesweep-requirements.sha256"
# What the server imports at start-up; torchvision.transforms fails when torch and torchvision do not match.
IMPORT_CHECK = "import sglang, torch, transformers, torchvision.transforms; print(sglang.__version__)"

PACKAGE_DIR = Path(__file__).resolve().parent
REQUIREMENTS = PACKAGE_DIR / "requirements.txt"
STAND_IN_DIR = PACKAGE_DIR / "stand_in"


class InstallError(RuntimeError):
    """The SGLang venv could not be built; the message says which step failed and why."""


def cache_dir() -> Path:
    """servesweep's cache root (`servesweep.files.cache_root`: `$SERVESWEEP_CACHE_DIR`, else the XDG cache)."""
    return cache_root().resolve()


def tier_dir() -> Path:
    return cache_dir() / "sglang-cpu"


def venv_dir() -> Path:
    return tier_dir() / "venv"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def pins_digest() -> str:
    """sha256 of requirements.txt's bytes and the sglang pin: what the stamp must hold."""
    h = hashlib.sha256()
    h.update(REQUIREMENTS.read_bytes())
    h.update(b"\n" + SGLANG_PIN.encode() + b"\n")
    return h.hexdigest()


def stamp_path(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / STAMP_NAME


def is_installed(venv: Path | None = None) -> bool:
    """True when the venv's stamp holds the current pins' digest (and its python exists)."""
    try:
        stamp = stamp_path(venv).read_text().strip()
    except OSError:
        return False
    return stamp == pins_digest() and venv_python(venv).exists()


@contextlib.contextmanager
def install_lock(timeout: float = 3600.0) -> Iterator[None]:
    """The tier's file lock (fcntl: released by the kernel if the holder dies, so no stale lock survives)."""
    tier_dir().mkdir(parents=True, exist_ok=True)
    path = tier_dir() / ".install.lock"
    with open(path, "a+") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InstallError(f"waited {timeout:g} s for the install lock {path}") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_imports(venv: Path | None = None, timeout: float = 300.0) -> str:
    """Import what the server needs with the venv's python; returns SGLang's version or raises InstallError."""
    py = venv_python(venv)
    try:
        out = subprocess.run(
            [str(py), "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=timeout,
            env=_clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InstallError(f"could not run {py} to check the imports: {e}") from e
    if out.returncode != 0:
        raise InstallError(
            f"the SGLang venv {py.parent.parent} does not import ({IMPORT_CHECK!r}):\n{_tail(out.stderr)}"
        )
    version = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if version != SGLANG_VERSION:
        raise InstallError(f"the SGLang venv has sglang {version!r}, expected {SGLANG_VERSION}")
    return version


def write_stamp(venv: Path | None = None) -> None:
    stamp_path(venv).write_text(pins_digest() + "\n")


def ensure_installed(log: Callable[[str], None] = print, *, force: bool = False) -> Path:
    """The SGLang venv's python, building the venv first if its stamp does not match the pins.

    Raises InstallError naming the failed step (venv creation, pip, the import check)."""
    if not force and is_installed():
        return venv_python()
    with install_lock():
        if not force and is_installed():  # another process built it while this one waited
            return venv_python()
        _build(log)
    return venv_python()


def _build(log: Callable[[str], None]) -> None:
    final = venv_dir()
    tmp = tier_dir() / f"venv.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    log(f"building SGLang's venv in {tmp} (pins: {REQUIREMENTS}, {SGLANG_PIN}); 2-4 min, ~6.3 GB")
    try:
        _run([sys.executable, "-m", "venv", str(tmp)], "create the venv")
        # the venv's bundled pip is enough for these wheels (no upgrade: one less download that can fail)
        pip = [str(venv_python(tmp)), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        _run([*pip, "-r", str(REQUIREMENTS)], f"install {REQUIREMENTS.name}")
        _run([*pip, "--no-deps", SGLANG_PIN], f"install {SGLANG_PIN} (--no-deps)")
        _relocate(tmp, final)
        # the import check runs from the temp folder: python finds its prefix from pyvenv.cfg beside it
        check_imports(tmp)
        write_stamp(tmp)
        old = tier_dir() / f"venv.old-{os.getpid()}"
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"SGLang's venv ready at {final} in {time.monotonic() - t0:.0f} s")


def _relocate(tmp: Path, final: Path) -> None:
    """Point the scripts of `tmp/bin` (shebangs, activate) at the venv's final path, which it is renamed to.

    Python itself needs no rewrite (it finds its prefix from pyvenv.cfg next to bin/); only text files that name
    the build folder do."""
    old, new = str(tmp).encode(), str(final).encode()
    for p in (tmp / "bin").iterdir():
        if p.is_symlink() or not p.is_file():
            continue
        data = p.read_bytes()
        if old in data and b"\0" not in data[:1024]:
            p.write_bytes(data.replace(old, new))


def _run(cmd: list[str], step: str) -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env())
    except OSError as e:
        raise InstallError(f"could not {step}: {e}") from e
    if out.returncode != 0:
        raise InstallError(f"could not {step} (exit {out.returncode}): {' '.join(cmd)}\n{_tail(out.stderr)}")


def _clean_env() -> dict[str, str]:
    """The environment for the venv's tools: without the caller's venv, so pip and python use their own."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    return env


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


BUILD_MODEL = PACKAGE_DIR / "build_model.py"


def model_dir() -> Path:
    """The tiny model's folder: `sglang-cpu/model-<hash>`, the hash of the builder and the pins (the builder is
    deterministic, so the same hash means the same tokenizer and weights)."""
    h = hashlib.sha256(BUILD_MODEL.read_bytes() + pins_digest().encode()).hexdigest()[:12]
    return tier_dir() / f"model-{h}"


def ensure_model(log: Callable[[str], None] = print) -> Path:
    """The tiny model's folder, built first (with SGLang's venv python, offline, ~5-10 s) when missing."""
    final = model_dir()
    if (final / "config.json").exists():
        return final
    python = ensure_installed(log)
    with install_lock():
        if (final / "config.json").exists():
            return final
        tmp = tier_dir() / f"{final.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"building the tiny model in {final}")
        try:
            _run([str(python), str(BUILD_MODEL), str(tmp)], "build the tiny model")
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final

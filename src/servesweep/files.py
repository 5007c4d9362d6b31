"""Atomic file writes: the one writer every part of servesweep uses for a file that readers may open at any moment
(run manifests, summaries, records, prompt-pool caches, exports, reports, live status files). Readers see the old
file or the whole new one, never a part: the data goes to a temp file in the same folder, which is renamed over the
target. Durable writes (the default) also fsync the file before the rename and the folder after it, so a finished
point survives a crash of the machine; `durable=False` is for files rewritten several times a second whose loss
costs nothing (a Locust process's live counters). Also `cache_root()`, the one place servesweep keeps what it
builds once and reuses (prompt pools, the real-SGLang environment). Imports nothing of servesweep: every layer
may use it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path, *, durable: bool = True, mode: int | None = None) -> Iterator[Path]:
    """A temp path beside `path` for a writer that wants a file name (pyarrow, a tokenizer's save ...); when the
    block ends without an exception the temp file is fsynced (durable), renamed over `path` and the folder fsynced
    (durable); on an exception it is removed. `mode`: permission bits (before the umask), e.g. 0o666 for a report
    meant for others; None keeps mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if durable:
            _fsync(tmp, os.O_RDONLY)
        if mode is not None:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, mode & ~umask)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent, os.O_RDONLY)


def write_atomic(path: str | Path, data: bytes | str, *, durable: bool = True, mode: int | None = None) -> Path:
    """Write a whole file atomically (and durably, by default); `str` is written as UTF-8."""
    with atomic_path(path, durable=durable, mode=mode) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def _fsync(p: Path, flags: int) -> None:
    fd = os.open(p, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cache_root() -> Path:
    """servesweep's cache folder: `$SERVESWEEP_CACHE_DIR` when set (the Makefile sets the project's `.cache/`, and
    `make test-cold` a new empty folder, so that no run is helped by leftovers), else `$XDG_CACHE_HOME/servesweep`,
    else `~/.cache/servesweep`."""
    env = os.environ.get("SERVESWEEP_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "servesweep"

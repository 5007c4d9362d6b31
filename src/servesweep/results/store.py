"""Writing results: `write_atomic`, the one atomic and durable file writer (temp file, fsync, rename, folder fsync),
and the start of a `servesweep load` run folder (its format: servesweep.results.runfolder).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from pathlib import Path

from servesweep.results.runfolder import MANIFEST


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> Path:
    """Write a whole file atomically and durably: a temp file in the same folder, fsynced, renamed over `path`,
    then the folder fsynced (so the rename survives a crash). `str` is written as UTF-8. `mode`: permission bits
    (before the umask) for a file meant to be read by others, e.g. 0o666 for a report; None keeps mkstemp's
    private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, mode & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def write_json_atomic(path: Path, data) -> None:
    """`data` as indented JSON, written with `write_atomic`: Paths as strings, pydantic models dumped, any other
    object as its str() (a manifest save must not fail on one odd value)."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=_default) + "\n")


def _default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    return str(o)


def new_run(root: Path, prefix: str = "load") -> tuple[str, Path]:
    """A fresh run folder under root: <prefix>-<UTC time>-<4 hex>."""
    run_id = f"{prefix}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(2)}"
    path = Path(root) / run_id
    path.mkdir(parents=True, exist_ok=False)
    return run_id, path


def write_manifest(run_dir: Path, manifest: dict) -> None:
    write_json_atomic(Path(run_dir) / MANIFEST, manifest)

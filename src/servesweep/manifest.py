"""The run manifest: `runs/<run_id>/manifest.json`, the one file that says what a run is and how far it got.

It holds the experiment as run, the plan, the resolved server info per configuration, versions, host facts, the git
revision and a status per point. It is rewritten atomically (temporary file, fsync, rename) after every change,
so a run killed at any instant leaves either the previous or the next manifest, never a torn one; that is what
`servesweep run --resume` trusts.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"

# Point statuses. Finished ones are never run again on resume; the others are.
DONE = "done"
PENDING = "pending"
RUNNING = "running"
FAILED = "failed"  # the load point itself failed (the load generator raised)
SERVER_FAILED = "server_failed"  # its server configuration did not start, failed verification or crashed
INFEASIBLE = "infeasible"  # dropped by the planner, with a reason
FINISHED = {DONE, INFEASIBLE}


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Manifest:
    """A dict with a save() that is atomic; small helpers for the parts the orchestrator changes."""

    def __init__(self, run_dir: Path, data: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.data = data

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST

    @classmethod
    def load(cls, run_dir: Path) -> Manifest:
        path = Path(run_dir) / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} does not exist: is {run_dir} a servesweep run folder?") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); the run folder is damaged") from None
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
            )
        return cls(Path(run_dir), data)

    def save(self) -> None:
        self.data["updated"] = now_iso()
        write_json_atomic(self.path, self.data)

    # -- points and configurations --

    @property
    def points(self) -> dict[str, dict[str, Any]]:
        return self.data["points"]

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        return self.data["configs"]

    def set_point(self, point_id: str, **fields: Any) -> None:
        self.points[point_id].update(fields)
        self.save()

    def set_config(self, config_id: str, **fields: Any) -> None:
        self.configs[config_id].update(fields)
        self.save()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.points.values():
            out[p["status"]] = out.get(p["status"], 0) + 1
        return out


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("servesweep", "locust", "ansible-core", "ansible-runner", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def git_revision(path: Path | None = None) -> str | None:
    """The servesweep checkout's commit (with '-dirty' when it has local changes), or None outside git."""
    cwd = path or Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("-dirty" if dirty else "")


def controller_facts() -> dict[str, Any]:
    """The machine running the load generator (the server hosts' facts come from Ansible)."""
    import psutil

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": sys.executable,
        "started_unix": time.time(),
    }

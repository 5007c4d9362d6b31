"""The manifest of a `servesweep run` (`runs/<run_id>/manifest.json`, format in servesweep.results.runfolder), the
one file that says what a run is and how far it got, and `processes.json`, the processes a run started.

The manifest holds the experiment as run, the plan, the resolved server info per configuration, versions, host
facts, the git revision and a status per point. It is rewritten with store.write_json_atomic after every change, so
a run killed at any instant leaves either the previous or the next manifest, never a torn one; that is what
`servesweep run --resume` trusts.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from servesweep.results.runfolder import MANIFEST
from servesweep.results.store import write_json_atomic

SCHEMA_VERSION = 1

# Point statuses. Finished ones are never run again on resume; the others are.
DONE = "done"
PENDING = "pending"
RUNNING = "running"
FAILED = "failed"  # the load point itself failed (the load generator raised)
SERVER_FAILED = "server_failed"  # its server configuration did not start, failed verification or crashed
INFEASIBLE = "infeasible"  # dropped by the planner, with a reason
FINISHED = {DONE, INFEASIBLE}


def _plain(o: Any) -> Any:
    """What JSON cannot hold as it is: pydantic models dumped, anything else (paths) as its str()."""
    return o.model_dump(mode="json") if hasattr(o, "model_dump") else str(o)


def now_iso() -> str:
    # milliseconds: a point of 2.6 s read 2.0 s from whole-second stamps (issue 34, item 5: the report's estimate
    # against actual time, and its ratios, were off by up to 40%)
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Manifest:
    """A dict with a save() that is atomic; small helpers for the parts the orchestrator changes."""

    def __init__(self, run_dir: Path, data: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.data = data
        self._lock = threading.Lock()  # a packed run saves from one thread per placement

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
        with self._lock:
            self.data["updated"] = now_iso()
            # one pass of the C encoder (no indent) copies the data while no other thread can change it; the
            # indented file is written from that copy
            snapshot = json.loads(json.dumps(self.data, default=_plain))
            write_json_atomic(self.path, snapshot)

    # -- points and configurations --

    @property
    def points(self) -> dict[str, dict[str, Any]]:
        return self.data["points"]

    @property
    def configs(self) -> dict[str, dict[str, Any]]:
        return self.data["configs"]

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

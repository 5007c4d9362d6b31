"""Writing results: JSON documents through the one atomic writer (servesweep.files), and the start of a
`servesweep load` run folder (its format: servesweep.results.runfolder).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from servesweep.files import write_atomic

MANIFEST = "manifest.json"  # a run folder's manifest (its reader: results/runfolder.py)


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

"""The results folder of `servesweep load`: `runs/<run_id>/<point_id>/{records.parquet,summary.json,locust.log}`
plus `runs/<run_id>/manifest.json`. Every file is written atomically (temp file + rename in the same folder).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from pathlib import Path

MANIFEST = "manifest.json"


def write_json_atomic(path: Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False, default=_default)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "model_dump"):
        return o.model_dump(mode="json")
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")


def new_run(root: Path, prefix: str = "load") -> tuple[str, Path]:
    """A fresh run folder under root: <prefix>-<UTC time>-<4 hex>."""
    run_id = f"{prefix}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(2)}"
    path = Path(root) / run_id
    path.mkdir(parents=True, exist_ok=False)
    return run_id, path


def write_manifest(run_dir: Path, manifest: dict) -> None:
    write_json_atomic(Path(run_dir) / MANIFEST, manifest)


def read_summary(point_dir: Path) -> dict:
    p = Path(point_dir) / "summary.json"
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no summary (the point did not finish)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None

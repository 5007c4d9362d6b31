"""Writing results: JSON documents through the one atomic writer (servesweep.files), and the start of a
`servesweep load` run folder (its format: servesweep.results.runfolder).
"""

from __future__ import annotations

import json
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


def new_run_id(name: str) -> str:
    """The one run id format, `servesweep run`'s and `servesweep load`'s: <name>-<UTC date>-<UTC time>."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def new_run(root: Path, name: str = "load") -> tuple[str, Path]:
    """A fresh run folder under `root`: `new_run_id(name)`, or that id with `-2`, `-3` ... when it is taken (two
    runs started in the same second); (its id, its path)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    run_id = base = new_run_id(name)
    n = 1
    while True:
        try:
            (root / run_id).mkdir()
            return run_id, root / run_id
        except FileExistsError:
            n += 1
            run_id = f"{base}-{n}"



"""The live record feed: the finished requests a Locust process (the local runner, or the master with its workers'
batches) writes into its point's work folder while the point runs, and the parent's reader.

The parent asks for it by naming a folder in the child's environment (LIVE_DIR_ENV). About once a second each
Locust process that sees the variable (the local runner or master as `<seq>.arrow`, each local worker as
`w<pid>-<seq>.arrow`) writes the rows its record buffer gained as one Arrow IPC file, renamed into place whole; the
parent reads each file once and removes it. A worker's rows also reach the master with its reports, so the master
writes them again later: readers skip request ids they saw (a worker on another host has no such folder, and the
master's copy is its only one). Rows are the records of results/records.py, complete when written
(a request enters the buffer when it ends), so a reader that also reads the point's final records.parquet skips the
request ids it saw here. Nothing of this runs per chunk.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.ipc

from servesweep.files import atomic_path
from servesweep.results.records import columns_to_table

LIVE_DIR_ENV = "SERVESWEEP_LIVE_DIR"  # the folder the child writes its batches into
RUN_ID_ENV = "SERVESWEEP_RUN_ID"  # the run_id a Locust process's own exporter labels its series with
INTERVAL_S = 1.0  # how often the child writes what its buffer gained
_SUFFIX = ".arrow"


def write_batch(folder: Path, seq: int, cols: dict[str, list], prefix: str = "") -> Path:
    """Write one batch (RecordBuffer columns) as `<folder>/<prefix><seq>.arrow`, renamed into place whole; `prefix`
    keeps the names of processes writing into one folder apart."""
    table = columns_to_table(cols)
    final = folder / f"{prefix}{seq:010d}{_SUFFIX}"
    # not durable: a batch lost to a machine crash is in the point's records file anyway
    with atomic_path(final, durable=False) as tmp, pa.OSFile(str(tmp), "wb") as f:
        with pyarrow.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    return final


class FeedReader:
    """The parent's side: `poll()` returns the rows of the batches written since the last call, each batch once."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows_read = 0

    def poll(self) -> list[dict]:
        rows: list[dict] = []
        for path in sorted(self.folder.glob(f"*{_SUFFIX}")):
            try:
                with pa.memory_map(str(path)) as src:
                    rows.extend(pyarrow.ipc.open_file(src).read_all().to_pylist())
            except (OSError, pa.ArrowInvalid):  # removed meanwhile, or not a batch: skip it
                continue
            finally:
                path.unlink(missing_ok=True)
        self.rows_read += len(rows)
        return rows

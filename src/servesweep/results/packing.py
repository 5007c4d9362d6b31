"""Whether a point ran packed (next to other servers on its host: `servesweep run --max-parallel N`) or alone.

A packed run labels its points `packing: packed`, and the isolation sample it re-runs alone (matrix/isolation_rerun.py)
`packing: alone` with `isolation_of` naming the packed point; points of serial runs carry no label and ran alone.
compare and the report read it here, so a packed point is never compared with an alone one unannounced.
"""

from __future__ import annotations

from typing import Any

PACKED = "packed"
ALONE = "alone"


def point_packing(entry: dict[str, Any] | None) -> str:
    """'packed' or 'alone' for a manifest point entry ({} or None: a point without a manifest ran alone)."""
    labels = ((entry or {}).get("point") or {}).get("labels") or {}
    return PACKED if labels.get("packing") == PACKED else ALONE


def is_isolation_sample(entry: dict[str, Any] | None) -> bool:
    """A packed run's re-run of one of its points alone (kept for the isolation report, not a matrix point)."""
    return bool((entry or {}).get("isolation_of"))

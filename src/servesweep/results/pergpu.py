"""Per-GPU normalisation: the GPUs a server configuration holds and its totals per GPU, so that TP1 on one GPU and
TP8 on eight compare fairly wherever configurations are compared (the report's point tables, `servesweep compare`,
the console table of `servesweep run`, the exporter, the capacity table).

The GPU count of a configuration is the launcher's `gpus` when set (a generic server whose own flags do not say
it), else tp × dp × pp from its flags. A point knows its count three ways, first found wins: the `gpu_count`
label the orchestrator puts on every point it plans, its configuration's flags in the run's manifest, none (a
`servesweep load` against a server whose GPUs servesweep was never told: the per-GPU columns then read "-").

This module sits in results/ (below matrix/, observe/ and the report) so every one of them can use it; it imports
nothing of results/ itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

# The point label with the count (the packed runs' `gpus` label holds the device ids, "0,1").
LABEL = "gpu_count"

# The totals that get a per-GPU value, and the name of that value.
PER_GPU: dict[str, str] = {
    "output_tokens_per_s": "output_tokens_per_s_per_gpu",
    "request_rate": "request_rate_per_gpu",
}


def gpu_count(tp: int = 1, dp: int = 1, pp: int = 1, gpus: int | None = None) -> int:
    """GPUs a configuration holds: the stated count when given (the launcher's `gpus`, when the server's own
    parallelism does not say it), else tp × dp × pp."""
    n = gpus if gpus is not None else tp * dp * pp
    if n < 1:
        raise ValueError(f"GPU count {n}: must be >= 1")
    return int(n)


def per_gpu(value: float | None, gpus: int | None) -> float | None:
    """A total (output tok/s, requests/s) per GPU; None when either is unknown."""
    if value is None or gpus is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value / gpus


def normalised(output_tokens_per_s: float, request_rate: float, gpus: int) -> dict[str, float | None]:
    """The totals and their per-GPU values, side by side."""
    return {
        "gpus": gpus,
        "output_tokens_per_s": output_tokens_per_s,
        "output_tokens_per_s_per_gpu": per_gpu(output_tokens_per_s, gpus),
        "request_rate": request_rate,
        "request_rate_per_gpu": per_gpu(request_rate, gpus),
    }


def flags_gpus(flags: Mapping[str, Any] | None, launcher_gpus: int | None = None) -> int:
    """GPU count from a configuration's flags (tp_size, dp_size, pp_size; absent: 1) or the launcher's `gpus`."""
    f = flags or {}
    return gpu_count(
        int(f.get("tp_size") or 1), int(f.get("dp_size") or 1), int(f.get("pp_size") or 1), launcher_gpus
    )


def manifest_gpus(manifest: Mapping[str, Any]) -> dict[str, int]:
    """{config_id: GPUs} for every server configuration of a `servesweep run` manifest ({} for other runs)."""
    launcher = ((manifest.get("experiment") or {}).get("launcher") or {}).get("gpus")
    return {cid: flags_gpus(c.get("flags"), launcher) for cid, c in (manifest.get("configs") or {}).items()}


def point_gpus(summary: Mapping[str, Any] | None, config_id: str | None, manifest: Mapping[str, Any]) -> int | None:
    """One point's GPU count: its `gpu_count` label, else its configuration's in the manifest, else None (unknown)."""
    label = (((summary or {}).get("point") or {}).get("labels") or {}).get(LABEL)
    if label not in (None, ""):
        return int(label)
    return manifest_gpus(manifest).get(config_id) if config_id else None


def with_per_gpu(values: dict[str, Any], gpus: int | None) -> dict[str, Any]:
    """`values` with each PER_GPU total's per-GPU value added (None where the total or the count is unknown)."""
    return values | {pg: per_gpu(values.get(total), gpus) for total, pg in PER_GPU.items() if total in values}


def with_per_gpu_changes(
    changes: list[Any], gpus_a: int | None, gpus_b: int | None, verdict: Callable[..., str], min_effect: float
) -> list[Any]:
    """`servesweep compare`'s changes (results/compare.py's Change) with, right after each PER_GPU total's, the same
    change per GPU (A's total over A's GPUs against B's over B's). The counts are constants, so the bootstrap
    interval of the relative change maps exactly: (b/gb)/(a/ga) - 1 = (1 + delta)·ga/gb - 1, the same for each end.
    Unchanged when either count is unknown."""
    if gpus_a is None or gpus_b is None:
        return list(changes)
    k = gpus_a / gpus_b

    def scale(x: float) -> float:
        return (1 + x) * k - 1 if math.isfinite(x) else math.nan

    out = []
    for c in changes:
        out.append(c)
        name = PER_GPU.get(c.metric.name)
        if name is None or not c.metric.relative:
            continue
        delta, lo, hi = scale(c.delta), scale(c.ci[0]), scale(c.ci[1])
        v = c.verdict if c.verdict == "n/a" else verdict(c.metric, delta, lo, hi, min_effect)
        out.append(
            dataclasses.replace(
                c,
                metric=dataclasses.replace(c.metric, name=name, unit=f"{c.metric.unit} per GPU".strip()),
                a=c.a / gpus_a,
                b=c.b / gpus_b,
                delta=delta,
                ci=(lo, hi),
                verdict=v,
            )
        )
    return out

"""The point runner's side of GPU telemetry: after a point, read the GPU samplers' samples of the point's window
(GET <sampler>/samples?since=&until=), reduce them (results/energy.py) and write the point folder's `gpu.json` and
`gpu_samples.jsonl` (docs/gpu-telemetry.md).

Samplers: the URLs the sglang_server role reports for the servers it started (sglang_server.gpu_sampler.url), given
to run_point as `gpu_telemetry`, or the environment variable SERVESWEEP_GPU_TELEMETRY (comma-separated URLs) for
`servesweep load` against a server whose sampler runs already. A sampler that does not answer is named in gpu.json
("errors"), never a failed point.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

from servesweep.results import energy
from servesweep.target import http

ENV = "SERVESWEEP_GPU_TELEMETRY"
FETCH_TIMEOUT_S = 10.0
MARGIN_S = 2.0  # samples kept beyond the window's ends (the interpolation at its edges needs one each side)


def sampler_urls(explicit: Sequence[str] | None = None) -> list[str]:
    if explicit:
        return [u.rstrip("/") for u in explicit if u]
    return [u.strip().rstrip("/") for u in os.environ.get(ENV, "").split(",") if u.strip()]


def fetch(url: str, since: float, until: float, timeout: float = FETCH_TIMEOUT_S) -> dict:
    """{"sampler", "source", "interval_s", "samples"} or {"sampler", "error"}; never raises."""
    try:
        doc = http.get_json(f"{url}/samples?since={since:.3f}&until={until:.3f}", timeout=timeout)
        return {"sampler": url, **doc}
    except Exception as e:  # ServerError (no answer, an error status, not JSON) or a document that is no mapping
        return {"sampler": url, "error": f"{type(e).__name__}: {e}"[:300]}


def wall_offset_ns(records: Path) -> int:
    """The records' monotonic-to-wall-clock offset (their mono_to_wall_ns, the median over the Locust processes;
    results/records.py), or this process's own where the file cannot be read."""
    try:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        col = pq.read_table(records, columns=["mono_to_wall_ns"]).column(0)
        if len(col):
            return int(pc.approximate_median(col).as_py())
    except Exception:
        pass
    return time.time_ns() - time.monotonic_ns()


def point_window(
    summary: dict, wall_start: float, wall_end: float, offset_ns: int | None = None
) -> tuple[float, float]:
    """The measured window in wall-clock seconds (summary window_ns, monotonic ns: first measured schedule to last
    end, plus the records' offset) when known, else the point's whole run."""
    w = summary.get("window_ns") or [math.nan, math.nan]
    off = (time.time_ns() - time.monotonic_ns()) if offset_ns is None else offset_ns
    try:
        a, b = (float(w[0]) + off) / 1e9, (float(w[1]) + off) / 1e9
    except (TypeError, ValueError, IndexError):
        a = b = math.nan
    if math.isfinite(a) and math.isfinite(b) and b > a:
        return a, b
    return wall_start, wall_end


def tokens(summary: dict) -> tuple[float | None, float | None]:
    """(output tokens, output + prompt tokens) of the point's ok measured requests."""
    out = summary.get("output_tokens")
    pt = summary.get("prompt_tokens") or {}
    prompt = pt["mean"] * pt["reported"] if pt.get("mean") is not None and pt.get("reported") else None
    return out, (out + prompt) if out is not None and prompt is not None else None


def write_point_gpu(
    urls: Sequence[str], out_dir: Path, summary: dict, wall_start: float, wall_end: float
) -> dict:
    """Fetch, reduce and write gpu.json (and the raw samples) into out_dir, through its model (energy.GpuFile);
    returns gpu.json's content as written."""
    try:
        return _write(urls, Path(out_dir), summary, wall_start, wall_end)
    except Exception as e:  # telemetry never fails a point: what went wrong is in gpu.json
        doc = {
            "schema": energy.SCHEMA,
            "errors": [{"sampler": ",".join(urls), "error": f"{type(e).__name__}: {e}"}],
        }
        return energy.save_gpu(out_dir, doc)


def _write(urls: Sequence[str], out_dir: Path, summary: dict, wall_start: float, wall_end: float) -> dict:
    start, end = point_window(summary, wall_start, wall_end, wall_offset_ns(out_dir / "records.parquet"))
    since = start - energy.IDLE_WINDOW_S - MARGIN_S
    sources = [fetch(u, since, end + MARGIN_S) for u in urls]
    for i, src in enumerate(
        sources
    ):  # the sample after the window's end may not be taken yet: once more, later
        last = max(
            (s["t"] for s in src.get("samples", [])), default=math.inf if src.get("error") else -math.inf
        )
        if last < end:
            time.sleep(min(2.0, float(src.get("interval_s") or 1.0) * 1.5))
            sources[i] = fetch(urls[i], since, end + MARGIN_S)
    out, total = tokens(summary)
    doc = energy.point_gpu(sources, start, end, output_tokens=out, total_tokens=total)
    tmp = Path(out_dir) / "gpu_samples.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for src in sources:
            for s in src.get("samples", []):
                f.write(json.dumps({"sampler": src["sampler"], **s}, separators=(",", ":")) + "\n")
    os.replace(tmp, Path(out_dir) / "gpu_samples.jsonl")
    return energy.save_gpu(out_dir, doc)

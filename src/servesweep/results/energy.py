"""What the GPUs did during one point, from the GPU sampler's samples (ansible/roles/sglang_server/files/
gpu_sampler.py): energy with the idle baseline subtracted and shown, joules per output token and per token, average
and peak power, utilization, clocks, throttling. The point runner writes it as the point's `gpu.json`
(driver/gpu_telemetry.py); docs/gpu-telemetry.md defines every figure.

A sample is {"t": wall-clock s, "gpus": [{"index", "name", "uuid", "util_pct", "power_w", "energy_mj",
"energy_source", "sm_clock_mhz", "temp_c", "throttle_reasons", "mem_used_bytes", ...}]}.
Energy over [start, end]: the energy counter (mJ) interpolated linearly at both ends; the trapezoid integral of the
power samples over the same window is computed too, and their difference shown (`counter_vs_integrated_pct`). A
GPU whose samples carry no counter (energy_source "integrated_power") gets the integral, and says so.
Idle baseline, per GPU: the median power of the samples at 0% utilization in the IDLE_WINDOW_S before the point
(between points); energy above idle = energy - idle_w x duration. None where no such sample exists (said so).

gpu.json's one model is `GpuFile` (results/schema.py VersionedFile: one load naming the file and the field, one
atomic save, schema_version 1). A file without `schema_version` is the format before the model, the same keys: it
loads as version 1; the figures added since (`tokens_per_joule`, the link traffic means) are absent there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from pydantic import Field

from servesweep.results.schema import Strict, VersionedFile

SCHEMA = "servesweep.gpu/1"
IDLE_WINDOW_S = 30.0  # the baseline's look-back before a point
# clock-event reasons that mean the GPU ran slower than its power limit allows: HW slowdown, SW/HW thermal, power
# brake. The power cap (sw_power_cap) is apart: a busy GPU at its limit is working as configured (the H200 sits
# there under a bf16 matmul), so it is shown as `power_capped`, not as throttling.
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80
POWER_CAP = 0x4
LINK_RATES = ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps")  # the sampler's, where NVML has them
REASONS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


GPU_JSON: Final = "gpu.json"  # a point folder's GPU telemetry (driver/gpu_telemetry.py writes it)


class Throttle(Strict):
    """A GPU's throttling inside the point: any sample throttled, the reasons, the share of samples throttled."""

    seen: bool
    reasons: list[str]
    fraction: float


class GpuFigures(Strict):
    """One GPU over the point (gpu_energy), with the sampler that reported it and its source (nvml, sim)."""

    sampler: str
    source: str
    index: int
    name: str
    uuid: str
    samples: int
    coverage: float
    energy_j: float | None
    energy_source: str
    energy_integrated_j: float | None
    counter_vs_integrated_pct: float | None
    idle_w: float | None
    idle_samples: int
    idle_energy_j: float | None
    energy_above_idle_j: float | None
    power_avg_w: float | None
    power_peak_w: float | None
    power_limit_w: float | None
    util_mean_pct: float | None
    util_max_pct: float | None
    sm_clock_mean_mhz: float | None
    sm_clock_min_mhz: float | None
    temp_max_c: float | None
    mem_used_max_bytes: int | None
    # link traffic (MB/s, mean over the point) where NVML has it; absent in files from before issue 31's links
    pcie_tx_mb_s_mean: float | None = None
    pcie_rx_mb_s_mean: float | None = None
    nvlink_tx_mb_s_mean: float | None = None
    nvlink_rx_mb_s_mean: float | None = None
    throttle: Throttle
    power_capped_fraction: float
    notes: list[str]


class GpuTotal(Strict):
    """The point's GPUs together (point_gpu's `total`): what summary.json's "gpu", compare and gate read."""

    gpus: int
    energy_j: float | None
    energy_sources: list[str]
    idle_w: float | None
    idle_energy_j: float | None
    energy_above_idle_j: float | None
    power_avg_w: float | None
    power_peak_w: float | None
    util_mean_pct: float | None
    util_max_pct: float | None
    counter_vs_integrated_pct_max: float | None
    output_tokens: float | None
    total_tokens: float | None
    joules_per_output_token: float | None
    joules_per_token: float | None
    joules_per_output_token_above_idle: float | None
    joules_per_token_above_idle: float | None
    output_tokens_per_joule: float | None
    tokens_per_joule: float | None = None  # absent in the first files
    throttled: bool
    throttle_reasons: list[str]
    throttled_gpus: list[str]
    power_capped_fraction_max: float | None


class Window(Strict):
    """The measured window, wall-clock seconds."""

    start: float
    end: float
    duration_s: float


class SamplerError(Strict):
    """A sampler that did not answer (or the telemetry step itself failing): named, never a failed point."""

    sampler: str
    error: str


class GpuFile(VersionedFile):
    """A point folder's gpu.json, schema_version 1. `schema` is the format's older name, kept. A file of a failed
    telemetry step holds only `schema` and `errors`."""

    WHAT: ClassVar[str] = "GPU telemetry file (gpu.json)"

    schema_version: Literal[1] = 1
    schema_name: str = Field(SCHEMA, alias="schema")
    window: Window | None = None
    idle_window_s: float | None = None
    total: GpuTotal | None = None
    gpus: list[GpuFigures] = []
    errors: list[SamplerError] = []


def save_gpu(folder: str | Path, doc: dict[str, Any]) -> dict[str, Any]:
    """A point's gpu.json (point_gpu's document) checked and written atomically into `folder`; the JSON written."""
    return GpuFile.save_data(Path(folder) / GPU_JSON, doc)


def load_gpu(folder: str | Path) -> GpuFile | None:
    """The point folder's gpu.json, checked; None where it has none (no GPU sampler ran). ValueError naming the
    file and the field of a damaged one."""
    try:
        return GpuFile.load(Path(folder) / GPU_JSON)
    except FileNotFoundError:
        return None


def _at(ts: Sequence[float], vs: Sequence[float], t: float) -> float | None:
    """vs at time t, linear between the samples around it; None outside [ts[0], ts[-1]]."""
    if not ts or t < ts[0] or t > ts[-1]:
        return None
    for i in range(1, len(ts)):
        if ts[i] >= t:
            t0, t1 = ts[i - 1], ts[i]
            if t1 <= t0:
                return vs[i]
            return vs[i - 1] + (vs[i] - vs[i - 1]) * (t - t0) / (t1 - t0)
    return vs[-1]


def _integral(ts: Sequence[float], vs: Sequence[float], a: float, b: float) -> float:
    """Trapezoid integral of the piecewise-linear series over [a, b] ∩ [ts[0], ts[-1]]."""
    lo, hi = max(a, ts[0]), min(b, ts[-1])
    if hi <= lo:
        return 0.0
    pts = (
        [(lo, _at(ts, vs, lo))]
        + [(t, v) for t, v in zip(ts, vs, strict=True) if lo < t < hi]
        + [(hi, _at(ts, vs, hi))]
    )
    return sum(
        (t1 - t0) * ((v0 or 0.0) + (v1 or 0.0)) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False)
    )


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def gpu_energy(
    samples: Sequence[dict], start: float, end: float, idle_window_s: float = IDLE_WINDOW_S
) -> list[dict]:
    """Per GPU figures over [start, end] (wall-clock seconds) from one sampler's samples (any order, any span)."""
    samples = sorted(samples, key=lambda s: s["t"])
    dur = max(end - start, 1e-9)
    by_gpu: dict[int, list[tuple[float, dict]]] = {}
    for s in samples:
        for g in s.get("gpus", []):
            by_gpu.setdefault(int(g["index"]), []).append((float(s["t"]), g))
    out = []
    for idx in sorted(by_gpu):
        rows = by_gpu[idx]
        pw = [(t, g["power_w"]) for t, g in rows if g.get("power_w") is not None]
        en = [(t, g["energy_mj"]) for t, g in rows if g.get("energy_mj") is not None]
        inside = [g for t, g in rows if start <= t <= end]
        counter = bool(en) and all(g.get("energy_source", "counter") == "counter" for _, g in rows)
        integrated = _integral([t for t, _ in pw], [v for _, v in pw], start, end) if len(pw) > 1 else None
        e0 = _at([t for t, _ in en], [v for _, v in en], start) if en else None
        e1 = _at([t for t, _ in en], [v for _, v in en], end) if en else None
        covered = (min(end, rows[-1][0]) - max(start, rows[0][0])) / dur if rows else 0.0
        notes = []
        energy: float | None
        if counter and e0 is not None and e1 is not None:
            energy, source = (e1 - e0) / 1000.0, "counter"
        elif en and e0 is not None and e1 is not None:
            energy, source = (e1 - e0) / 1000.0, "integrated_power"
            notes.append("no energy counter on this GPU: the sampler's integral of its power draw")
        else:
            energy, source = integrated, "integrated_power"
            notes.append("the samples do not span the point: the power samples inside it, integrated")
        idle_ps = [
            g["power_w"]
            for t, g in rows
            if start - idle_window_s <= t < start and g.get("util_pct") == 0 and g.get("power_w") is not None
        ]
        # the median: a reading just after a load may still be settling
        idle_w = statistics.median(idle_ps) if idle_ps else None
        if idle_w is None:
            notes.append(
                f"no idle sample in the {idle_window_s:g} s before the point: no baseline subtracted"
            )
        reasons = 0
        throttled = capped = 0
        for g in inside:
            r = int(g.get("throttle_reasons") or 0)
            reasons |= r & THROTTLE_MASK
            throttled += bool(r & THROTTLE_MASK)
            capped += bool(r & POWER_CAP)
        powers = [g["power_w"] for g in inside if g.get("power_w") is not None]
        utils = [g["util_pct"] for g in inside if g.get("util_pct") is not None]
        sms = [g["sm_clock_mhz"] for g in inside if g.get("sm_clock_mhz") is not None]
        temps = [g["temp_c"] for g in inside if g.get("temp_c") is not None]
        mem = [g["mem_used_bytes"] for g in inside if g.get("mem_used_bytes") is not None]
        # link traffic where NVML has it (the sampler's rates between samples, bytes/s): mean over the point, MB/s
        links = {
            f"{k[: -len('_bps')]}_mb_s_mean": _mean(g[k] / 1e6 for g in inside if g.get(k) is not None)
            for k in LINK_RATES
        }
        last = rows[-1][1]
        out.append(
            {
                "index": idx,
                "name": last.get("name", ""),
                "uuid": last.get("uuid", ""),
                "samples": len(inside),
                "coverage": round(max(0.0, min(1.0, covered)), 4),
                "energy_j": energy,
                "energy_source": source,
                "energy_integrated_j": integrated,
                "counter_vs_integrated_pct": (integrated - energy) / energy * 100
                if source == "counter" and integrated is not None and energy
                else None,
                "idle_w": idle_w,
                "idle_samples": len(idle_ps),
                "idle_energy_j": idle_w * dur if idle_w is not None else None,
                "energy_above_idle_j": energy - idle_w * dur
                if idle_w is not None and energy is not None
                else None,
                "power_avg_w": energy / dur if energy is not None else None,
                "power_peak_w": max(powers) if powers else None,
                "power_limit_w": last.get("power_limit_w"),
                "util_mean_pct": _mean(utils),
                "util_max_pct": max(utils) if utils else None,
                "sm_clock_mean_mhz": _mean(sms),
                "sm_clock_min_mhz": min(sms) if sms else None,
                "temp_max_c": max(temps) if temps else None,
                "mem_used_max_bytes": max(mem) if mem else None,
                **links,
                "throttle": {
                    "seen": bool(reasons),
                    "reasons": [n for b, n in REASONS.items() if reasons & b],
                    "fraction": throttled / len(inside) if inside else 0.0,
                },
                "power_capped_fraction": capped / len(inside) if inside else 0.0,
                "notes": notes,
            }
        )
    return out


def _sum(xs: list[float | None]) -> float | None:
    return None if not xs or any(x is None for x in xs) else float(sum(x for x in xs if x is not None))


def _per(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def point_gpu(
    sources: Sequence[dict],
    start: float,
    end: float,
    *,
    output_tokens: float | None,
    total_tokens: float | None,
    idle_window_s: float = IDLE_WINDOW_S,
) -> dict:
    """The point's gpu.json: `sources` = [{"sampler": URL, "source": "nvml"|"sim", "samples": [...]}, ...] (one per
    GPU host, or per server of a packed run); tokens: the point's measured output tokens and output + prompt."""
    gpus: list[dict] = []
    errors = []
    for src in sources:
        if src.get("error"):
            errors.append({"sampler": src.get("sampler", ""), "error": src["error"]})
            continue
        for g in gpu_energy(src.get("samples", []), start, end, idle_window_s):
            gpus.append({"sampler": src.get("sampler", ""), "source": src.get("source", ""), **g})
    dur = max(end - start, 1e-9)
    energy = _sum([g["energy_j"] for g in gpus])
    idle = _sum([g["idle_energy_j"] for g in gpus])
    above = _sum([g["energy_above_idle_j"] for g in gpus])
    agree = [g["counter_vs_integrated_pct"] for g in gpus if g["counter_vs_integrated_pct"] is not None]
    peaks = [g["power_peak_w"] for g in gpus if g["power_peak_w"] is not None]
    utils = [g["util_mean_pct"] for g in gpus if g["util_mean_pct"] is not None]
    umax = [g["util_max_pct"] for g in gpus if g["util_max_pct"] is not None]
    throttled = [g for g in gpus if g["throttle"]["seen"]]
    total = {
        "gpus": len(gpus),
        "energy_j": energy,
        "energy_sources": sorted({g["energy_source"] for g in gpus}),
        "idle_w": _sum([g["idle_w"] for g in gpus]),
        "idle_energy_j": idle,
        "energy_above_idle_j": above,
        "power_avg_w": _per(energy, dur),
        # the GPUs' peaks added: an upper bound of the host's peak (they need not peak at once)
        "power_peak_w": float(sum(peaks)) if peaks else None,
        "util_mean_pct": _mean(utils),
        "util_max_pct": max(umax) if umax else None,
        "counter_vs_integrated_pct_max": max(agree, key=abs) if agree else None,
        "output_tokens": output_tokens,
        "total_tokens": total_tokens,
        "joules_per_output_token": _per(energy, output_tokens),
        "joules_per_token": _per(energy, total_tokens),
        "joules_per_output_token_above_idle": _per(above, output_tokens),
        "joules_per_token_above_idle": _per(above, total_tokens),
        "output_tokens_per_joule": _per(output_tokens, energy),
        "tokens_per_joule": _per(total_tokens, energy),
        "throttled": bool(throttled),
        "throttle_reasons": sorted({r for g in throttled for r in g["throttle"]["reasons"]}),
        "throttled_gpus": [f"{g['sampler']}#{g['index']}" for g in throttled],
        "power_capped_fraction_max": max((g["power_capped_fraction"] for g in gpus), default=None),
    }
    return {
        "schema": SCHEMA,
        "window": {"start": start, "end": end, "duration_s": dur},
        "idle_window_s": idle_window_s,
        "total": total,
        "gpus": gpus,
        "errors": errors,
    }


def summary_fields(gpu: dict | None) -> dict:
    """The few figures a summary row, table column or report line shows (None where no telemetry): run_point
    puts them into summary.json under "gpu"; `errors` names samplers that did not answer."""
    t = (gpu or {}).get("total") or {}
    keys = (
        "energy_j",
        "energy_above_idle_j",
        "idle_w",
        "power_avg_w",
        "power_peak_w",
        "util_mean_pct",
        "util_max_pct",
        "joules_per_output_token",
        "joules_per_token",
        "joules_per_output_token_above_idle",
        "output_tokens_per_joule",
        "tokens_per_joule",
        "throttled",
        "throttle_reasons",
        "throttled_gpus",
        "power_capped_fraction_max",
        "energy_sources",
    )
    return {**{k: t.get(k) for k in keys}, "errors": list((gpu or {}).get("errors") or [])}


def throttle_flag(gpu: dict | None) -> str | None:
    """The report's wording for a point whose GPUs throttled, None when they did not (or nothing is known); `gpu`:
    gpu.json, or summary.json's "gpu" (summary_fields)."""
    t = (gpu or {}).get("total", gpu) or {}
    if not t.get("throttled"):
        return None
    return (
        f"GPU throttled ({', '.join(t['throttle_reasons'])}) on {', '.join(t.get('throttled_gpus') or ['?'])}"
    )


def is_finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def pooled(docs: Sequence[dict]) -> dict | None:
    """The energy figures of several gpu.json documents taken as one measurement (a capacity search's calls at one
    load: results/capacity.py): energies, tokens and durations added, then divided, so a longer call weighs more.
    None when no document measured any energy; a figure any document lacks (no idle baseline) is None."""
    docs = [d for d in docs if ((d or {}).get("total") or {}).get("energy_j") is not None]
    if not docs:
        return None
    tots = [d["total"] for d in docs]
    energy = _sum([t["energy_j"] for t in tots])
    above = _sum([t.get("energy_above_idle_j") for t in tots])
    out_tok = _sum([t.get("output_tokens") for t in tots])
    all_tok = _sum([t.get("total_tokens") for t in tots])
    dur = _sum([(d.get("window") or {}).get("duration_s") for d in docs])
    throttled = [t for t in tots if t.get("throttled")]
    return {
        "calls": len(docs),
        "energy_j": energy,
        "energy_above_idle_j": above,
        "duration_s": dur,
        "output_tokens": out_tok,
        "total_tokens": all_tok,
        "joules_per_output_token": _per(energy, out_tok),
        "joules_per_token": _per(energy, all_tok),
        "joules_per_output_token_above_idle": _per(above, out_tok),
        "output_tokens_per_joule": _per(out_tok, energy),
        "tokens_per_joule": _per(all_tok, energy),
        "power_avg_w": _per(energy, dur),
        "throttled": bool(throttled),
        "throttle_reasons": sorted({r for t in throttled for r in t.get("throttle_reasons") or []}),
        "energy_sources": sorted({s for t in tots for s in t.get("energy_sources") or []}),
    }

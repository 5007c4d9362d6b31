"""The figures of bench/gpu/energy_serve.sh: per `servesweep load` point, its gpu.json (the sampler's energy counter,
its integrated power, the idle baseline, joules per token) beside nvidia-smi's power readings integrated over the
same window (the point's measured window, gpu.json `window`), and the link traffic the sampler saw.

  python3 bench/gpu/energy_serve_analyze.py DIR --out OUTDIR [--dry 1]

DIR holds load-c*/<run>/c*/{summary.json,gpu.json,gpu_samples.jsonl} and nvidia-smi.csv (header line of fields,
then `nvidia-smi --format=csv,noheader,nounits -lms 200` rows). Writes OUTDIR/energy.json and OUTDIR/energy.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def read_smi(path: Path) -> dict[str, list[tuple[float, float]]]:
    """{field: [(wall-clock s, value)]} from nvidia-smi's CSV (its timestamps are local time)."""
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    fields = [f.strip() for f in lines[0].split(",")]
    out: dict[str, list[tuple[float, float]]] = {f: [] for f in fields[1:]}
    for line in lines[1:]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        try:
            day, frac = parts[0].split(".") if "." in parts[0] else (parts[0], "0")
            ts = time.mktime(time.strptime(day, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
        except ValueError:
            continue
        for f, v in zip(fields[1:], parts[1:], strict=True):
            try:
                out[f].append((ts, float(v)))
            except ValueError:
                pass
    return out


def integral(rows: list[tuple[float, float]], a: float, b: float) -> float | None:
    """Trapezoid integral over [a, b] of the readings, linear between them; None unless they span the window."""
    if len(rows) < 2 or rows[0][0] > a or rows[-1][0] < b:
        return None

    def at(t: float) -> float:
        for (t0, v0), (t1, v1) in zip(rows, rows[1:], strict=False):
            if t0 <= t <= t1:
                return v0 if t1 <= t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return rows[-1][1]

    pts = [(a, at(a))] + [(t, v) for t, v in rows if a < t < b] + [(b, at(b))]
    return sum((t1 - t0) * (v0 + v1) / 2 for (t0, v0), (t1, v1) in zip(pts, pts[1:], strict=False))


def pct(x: float | None, ref: float | None) -> float | None:
    return (x - ref) / ref * 100 if x is not None and ref else None


def link_means(samples_file: Path, a: float, b: float) -> dict:
    """Mean link rates (MB/s) over the window from the point's raw samples, and whether NVML had the counters."""
    acc: dict[str, list[float]] = {}
    seen: dict[str, bool] = {}
    if not samples_file.exists():
        return {}
    for line in samples_file.read_text().splitlines():
        s = json.loads(line)
        for g in s.get("gpus", []):
            for k in ("pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes"):
                seen[k] = seen.get(k, False) or g.get(k) is not None
            if not a <= s["t"] <= b:
                continue
            for k in ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps"):
                if g.get(k) is not None:
                    acc.setdefault(k, []).append(g[k] / 1e6)
    return {
        "counters": seen,
        **{k.replace("_bps", "_mb_s_mean"): sum(v) / len(v) for k, v in acc.items() if v},
    }


def fmt(x: float | None, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:,.{nd}f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry", default="0")
    a = ap.parse_args()
    d, out = Path(a.dir), Path(a.out)
    smi = read_smi(d / "nvidia-smi.csv")
    rows = []
    for gj in sorted(d.glob("load-c*/*/c*/gpu.json"), key=lambda p: int(p.parent.name[1:])):
        g = json.loads(gj.read_text())
        s = json.loads((gj.parent / "summary.json").read_text())
        w = g.get("window") or {}
        t = g.get("total") or {}
        g0 = (g.get("gpus") or [{}])[0]
        start, end = w.get("start"), w.get("end")
        e = t.get("energy_j")
        smi_j = (
            integral(smi.get("power.draw [W]") or smi.get("power.draw") or [], start, end) if smi else None
        )
        smi_inst = (
            integral(smi.get("power.draw.instant [W]") or smi.get("power.draw.instant") or [], start, end)
            if smi
            else None
        )
        row = {
            "concurrency": int(gj.parent.name[1:]),
            "duration_s": w.get("duration_s"),
            "requests_ok": (s.get("requests") or {}).get("ok")
            if isinstance(s.get("requests"), dict)
            else s.get("ok"),
            "output_tokens": t.get("output_tokens"),
            "total_tokens": t.get("total_tokens"),
            "output_tokens_per_s": s.get("output_tokens_per_s"),
            "ttft_p50_ms": (s.get("ttft_ms") or {}).get("p50"),
            "itl_p50_ms": (s.get("itl_ms") or {}).get("p50"),
            "energy_counter_j": e,
            "energy_source": t.get("energy_sources"),
            "energy_integrated_j": g0.get("energy_integrated_j"),
            "counter_vs_integrated_pct": g0.get("counter_vs_integrated_pct"),
            "energy_nvidia_smi_j": smi_j,
            "nvidia_smi_vs_counter_pct": pct(smi_j, e),
            "energy_nvidia_smi_instant_j": smi_inst,
            "nvidia_smi_instant_vs_counter_pct": pct(smi_inst, e),
            "idle_w": t.get("idle_w"),
            "energy_above_idle_j": t.get("energy_above_idle_j"),
            "power_avg_w": t.get("power_avg_w"),
            "power_peak_w": t.get("power_peak_w"),
            "util_mean_pct": t.get("util_mean_pct"),
            "sm_clock_mean_mhz": g0.get("sm_clock_mean_mhz"),
            "sm_clock_min_mhz": g0.get("sm_clock_min_mhz"),
            "temp_max_c": g0.get("temp_max_c"),
            "power_limit_w": g0.get("power_limit_w"),
            "power_capped_fraction": g0.get("power_capped_fraction"),
            "throttle": g0.get("throttle"),
            "joules_per_output_token": t.get("joules_per_output_token"),
            "joules_per_token": t.get("joules_per_token"),
            "joules_per_output_token_above_idle": t.get("joules_per_output_token_above_idle"),
            "output_tokens_per_joule": t.get("output_tokens_per_joule"),
            "samples": g0.get("samples"),
            "links": link_means(gj.parent / "gpu_samples.jsonl", start or 0, end or 0),
            "notes": g0.get("notes"),
            "errors": g.get("errors"),
        }
        rows.append(row)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry": a.dry == "1", "points": rows}
    (out / "energy.json").write_text(json.dumps(doc, indent=1))
    md = [
        "| concurrency | s | out tok | out tok/s | counter J | integrated J (diff) | nvidia-smi J (diff) | "
        "smi instant J (diff) | idle W | avg W | peak W | util % | SM MHz | J/out tok | J/out tok above idle | "
        "J/tok | out tok/J |",
        "|" + "---|" * 17,
    ]
    for r in rows:
        md.append(
            f"| {r['concurrency']} | {fmt(r['duration_s'])} | {fmt(r['output_tokens'], 0)} | "
            f"{fmt(r['output_tokens_per_s'])} | {fmt(r['energy_counter_j'])} | "
            f"{fmt(r['energy_integrated_j'])} ({fmt(r['counter_vs_integrated_pct'], 2)} %) | "
            f"{fmt(r['energy_nvidia_smi_j'])} ({fmt(r['nvidia_smi_vs_counter_pct'], 2)} %) | "
            f"{fmt(r['energy_nvidia_smi_instant_j'])} ({fmt(r['nvidia_smi_instant_vs_counter_pct'], 2)} %) | "
            f"{fmt(r['idle_w'])} | {fmt(r['power_avg_w'])} | {fmt(r['power_peak_w'])} | "
            f"{fmt(r['util_mean_pct'])} | {fmt(r['sm_clock_mean_mhz'], 0)} | "
            f"{fmt(r['joules_per_output_token'], 3)} | {fmt(r['joules_per_output_token_above_idle'], 3)} | "
            f"{fmt(r['joules_per_token'], 4)} | {fmt(r['output_tokens_per_joule'], 2)} |"
        )
    (out / "energy.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    for r in rows:
        print(
            f"c={r['concurrency']}: links {json.dumps(r['links'])}; throttle {json.dumps(r['throttle'])}; "
            f"capped {r['power_capped_fraction']}; limit {r['power_limit_w']} W; temp max {r['temp_max_c']}; "
            f"TTFT p50 {fmt(r['ttft_p50_ms'])} ms; ITL p50 {fmt(r['itl_p50_ms'])} ms; samples {r['samples']}; "
            f"notes {r['notes']}; errors {r['errors']}"
        )
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Join run folders written by gpu_sweep.py (one per GPU call) into one, so `servesweep report` shows every
server setting side by side.

Each GPU call is capped at 10 minutes, and one server setting of the full matrix takes about 7 of them, so each
setting runs in its own call and lands in its own folder. Point folders are copied as they are (their ids carry
the setting's name; the same point twice is an error); the manifests' point lists, servers and not-run points
are joined, and a setting that appears in several calls keeps each call's server info.

Usage: python bench/gpu/merge_runs.py OUT_DIR RUN_DIR [RUN_DIR...]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def merge(out: Path, runs: list[Path]) -> dict:
    if out.exists():
        raise SystemExit(f"merge_runs: {out} exists; give a new folder")
    merged: dict = {
        "run_id": out.name,
        "kind": "load",
        "merged_from": [],
        "points": [],
        "not_run": [],
        "servers": {},
        "settings": {},
    }
    out.mkdir(parents=True)
    for run in runs:
        m = json.loads((run / "manifest.json").read_text())
        merged["merged_from"].append(m["run_id"])
        for key in ("server", "model_dir"):
            merged.setdefault(key, m.get(key))
        for name, info in m.get("servers", {}).items():
            info = {**info, "run_id": m["run_id"]}
            if name in merged["servers"]:  # the same setting, more points in a later call
                merged["servers"][name].setdefault("later_calls", []).append(info)
            else:
                merged["servers"][name] = info
        merged["settings"].update(m.get("settings", {}))
        done_here = {p["point_id"] for p in m["points"]}
        # a point skipped in one call and run in a later one is not "not run"
        merged["not_run"] = [x for x in merged["not_run"] if x["point_id"] not in done_here]
        merged["not_run"] += m.get("not_run", [])
        for p in m["points"]:
            if (out / p["dir"]).exists():
                raise SystemExit(f"merge_runs: point {p['dir']} is in two runs (again in {run})")
            shutil.copytree(run / p["dir"], out / p["dir"])
            merged["points"].append(p)
        if (run / "servers").is_dir():
            shutil.copytree(run / "servers", out / "servers", dirs_exist_ok=True)
        if (run / "gpu.csv").is_file():
            shutil.copy2(run / "gpu.csv", out / f"gpu-{m['run_id']}.csv")
    (out / "manifest.json").write_text(json.dumps(merged, indent=2) + "\n")
    return merged


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    m = merge(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
    print(f"{sys.argv[1]}: {len(m['points'])} points from {', '.join(m['merged_from'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

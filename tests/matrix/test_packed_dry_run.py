"""`servesweep run FILE --dry-run --max-parallel N` on the field's 8-GPU example (examples/qwen36-27b-rtxpro6000.yaml,
shrunk to one TP1, one TP4 and one TP8 configuration): the dry run packs the matrix onto this machine's
`launcher.gpus_per_host` GPUs (a dry run's inventory is always local), finishes with every point done exactly once
and writes the isolation report (each configuration's first point again, alone)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from support import run_servesweep

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen36-27b-rtxpro6000.yaml"
BUNDLES = ["ar", "dflash", "ddtree16", "ddtree32", "ddtree64"]


def _shrunk(tmp: Path) -> Path:
    """The example with autoregressive at TP1, DFLASH at TP4 and DDTREE at TP8, 3k prompts, single-shot requests,
    concurrency 1 and 8."""
    d = yaml.safe_load(EXAMPLE.read_text())
    keep = {1: "ar", 4: "dflash", 8: "ddtree32"}
    rules = [{"tp_size": tp, "bundle": [b for b in BUNDLES if b != k]} for tp, k in keep.items()]
    rules += [
        {"prompt_tokens": [30000, 100000]},
        {"concurrency": [2, 4, 16, 32, 64, 100]},
        {"workload": "agent"},
    ]
    d["exclude"] = list(d.get("exclude") or []) + rules
    f = tmp / EXAMPLE.name
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return f


def test_packed_dry_run_of_the_8_gpu_example_does_every_point_once_with_the_isolation_report(tmp_path):
    out = tmp_path / "runs"
    rc, text = run_servesweep(
        "run", str(_shrunk(tmp_path)), "--dry-run", "--max-parallel", "3", "--out", str(out), timeout=300, cwd=tmp_path
    )
    assert rc == 0, text[-5000:]
    (run_dir,) = out.iterdir()
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["dry_run"] is True and m["status"] == "finished"
    placements = m["packing"]["placements"]
    assert {pl["host"] for pl in placements} == {"localhost"}  # a dry run's inventory is this machine
    assert sorted(len(pl["gpus"].split(",")) for pl in placements) == [1, 4, 8]
    # every point done exactly once, in its own folder
    twins = {pid: p for pid, p in m["points"].items() if p.get("isolation_of")}
    assert len(m["points"]) == 3 * 2 + 3 and len(twins) == 3
    for pid, p in m["points"].items():
        assert p["status"] == "done" and p["attempts"] == 1, (pid, p["status"], p.get("reason"))
        req = json.loads((run_dir / p["dir"] / "summary.json").read_text())["requests"]
        assert req["ok"] == p["concurrency"] and req["failed"] == 0, (pid, req)
    folders = sorted(d.name for d in run_dir.iterdir() if (d / "summary.json").is_file())
    assert folders == sorted(m["points"])
    # the isolation report: manifest, report and console
    assert sorted(r["config"] for r in m["isolation"]["configs"]) == sorted(pl["config"] for pl in placements)
    assert "## Isolation: packed vs alone" in (run_dir / "report.md").read_text()
    assert all(f"isolation {pl['config']}" in text for pl in placements), text[-3000:]

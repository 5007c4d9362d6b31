"""Isolation measured: a packed run (TP1 and TP4 side by side on this machine's 8 declared GPUs) re-runs the first
point of each configuration alone after the packed phase, with nothing else running, and reports per configuration
the change packed vs alone of TTFT p50 and output tok/s with a bootstrap interval (manifest `isolation`, report
Markdown and HTML, an exporter gauge); `servesweep compare` refuses a packed point against an alone one unless told
to allow it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from packed_experiment import EXPERIMENT

from servesweep.matrix.isolation_rerun import _export
from servesweep.observe.exporter import ClientMetrics

SERVESWEEP = str(Path(sys.executable).parent / "servesweep")


def _t(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def test_a_packed_run_measures_its_isolation_and_compare_refuses_packed_vs_alone(tmp_path):
    exp = json.loads(json.dumps(EXPERIMENT))
    exp["server"]["axes"] = {"tp_size": [1, 4]}
    exp["load"].update(concurrency=[2, 4], requests=8)
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(exp))
    cmd = [SERVESWEEP, "run", str(f), "--out", str(tmp_path / "runs"), "--max-parallel", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    m = json.loads((run_dir / "manifest.json").read_text())
    twins = {pid: p for pid, p in m["points"].items() if p.get("isolation_of")}
    assert sorted(twins) == ["s01-tp1.chat-p256-o8-c2-alone", "s02-tp4.chat-p256-o8-c2-alone"], sorted(m["points"])
    packed_end = max(_t(p["finished"]) for p in m["points"].values() if not p.get("isolation_of"))
    for p in twins.values():
        twin_of = m["points"][p["isolation_of"]]
        assert p["status"] == "done" and p["point"]["labels"]["packing"] == "alone"
        assert twin_of["point"]["labels"]["packing"] == "packed"
        assert p["point"]["labels"]["gpus"] == twin_of["point"]["labels"]["gpus"]  # same GPUs, alone
        assert _t(p["started"]) >= packed_end  # after the packed phase: nothing else running
    iso = m["isolation"]
    assert iso["threshold"] == 0.10 and len(iso["configs"]) == 2
    for row in iso["configs"]:
        assert [c["metric"] for c in row["changes"]] == ["ttft_p50", "output_tokens_per_s"]
        for c in row["changes"]:
            assert c["ci_low"] is not None and c["ci_low"] <= c["change"] <= c["ci_high"], c
        assert row["flagged"] == [c["metric"] for c in row["changes"] if abs(c["change"]) > 0.10]
    md = (run_dir / "report.md").read_text()
    assert "## Isolation: packed vs alone" in md and "s01-tp1.chat-p256-o8-c2-alone" in md
    assert 'id="isolation"' in (run_dir / "report.html").read_text()
    assert "isolation s01-tp1" in r.stdout
    # a copy of the run whose points ran alone (a serial run's points carry no packing label)
    alone = tmp_path / "alone-run"
    shutil.copytree(run_dir, alone)
    ma = json.loads((alone / "manifest.json").read_text())
    for p in ma["points"].values():
        p["point"]["labels"].pop("packing", None)
    (alone / "manifest.json").write_text(json.dumps(ma))
    refused = subprocess.run(
        [SERVESWEEP, "compare", str(alone), str(run_dir)], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "one packed, one alone" in refused.stderr, refused.stderr
    assert "--allow-packed-vs-alone" in refused.stderr
    allowed = subprocess.run(
        [SERVESWEEP, "compare", str(alone), str(run_dir), "--allow-packed-vs-alone"],
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0 and "warning:" in allowed.stderr, allowed.stderr
    same = subprocess.run([SERVESWEEP, "compare", str(run_dir), str(run_dir)], capture_output=True, text=True)
    assert same.returncode == 0, (
        same.stderr
    )  # packed vs packed: compared; the alone twins are not matrix points


@pytest.mark.fast
def test_the_isolation_result_is_exported_with_a_flag_label():
    class R:
        metrics = ClientMetrics("r1")
        m = type("M", (), {"data": {"run_id": "r1"}})()

    iso = {
        "configs": [
            {
                "config": "s01",
                "flagged": ["ttft_p50"],
                "changes": [
                    {"metric": "ttft_p50", "change": 0.25},
                    {"metric": "output_tok_s", "change": -0.01},
                ],
            }
        ]
    }
    _export(R, iso)
    text = R.metrics.text().decode()
    assert (
        'servesweep_isolation_change_ratio{config="s01",flagged="true",metric="ttft_p50",run_id="r1"} 0.25'
        in text
    )
    assert 'metric="output_tok_s",run_id="r1"} -0.01' in text

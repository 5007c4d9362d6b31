"""Smoke of the 2-host chaos soak (bench/bench_chaos.py, issue 35): one round of `servesweep run` (1 configuration x
2 concurrencies, 8 requests a point) with its Locust workers on two emulated hosts (network namespaces, sshd, the
locust_worker role), two host-level faults forced in turn: a worker host's death on the first point, and `servesweep
run` SIGKILLed on the second and left for the soak's final `run --resume`, which must then measure it (a remote
worker's SIGKILL, short and long cuts are tests/driver/test_multihost.py's, and the soak's draws). Checked as the soak checks: every point done with figures matching the emulator's ground truth or
marked with its fault, 0 silently wrong, and the resume finishes the run. Then the judge must be able to fail: a
done point's records and summary edited so they disagree with the ground truth are flagged.

Real processes throughout (root for the namespaces; a missing tool fails, it never skips)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_chaos  # noqa: E402

# ~1-2 min on the 2-core machine: each point starts and stops its remote workers over SSH (~20 s)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
REQUESTS = 8

FORCED = ["host_death", "orchestrator_kill:end"]


def _events(out: Path) -> list[dict]:
    return [e for e in map(json.loads, (out / "chaos.jsonl").read_text().splitlines()) if "attempt" in e]


def test_two_host_soak_marks_every_fault_and_its_judge_catches_a_wrong_number(tmp_path):
    out = tmp_path / "soak"
    f = bench_chaos.soak(
        60, seed=7, out=out, hosts=2, force=list(FORCED), rounds_max=1, requests=REQUESTS, configs=(8,)
    )
    print(json.dumps({k: v for k, v in f.items() if k != "runs"}))
    assert f["wrong"] == [] and f["silently_wrong"] == 0 and f["rounds_hung"] == 0, f["wrong"]
    landed = {e["kind"] for e in _events(out) if not e.get("missed") and "error" not in e}
    missed = [e["kind"] for e in _events(out) if e.get("missed")]
    # a forced fault misses only when its attempt ended first
    assert {"host_death", "orchestrator_kill"} <= landed, (landed, missed)
    assert [e["resume"] for e in _events(out) if e["kind"] == "orchestrator_kill"] == [
        "at the end of the soak"
    ]
    assert f["points"] == 2 and f["outcomes"].get("unfinished", 0) == 0, f["outcomes"]
    # a host's death leaves its point degraded (measured on the workers left, marked), or failed with its reason
    # when the death took the point's requests with it: the final resume then measures it again (seen in a cold
    # run: {'failed': 1, 'running': 1} before the resume, {'done': 2} after)
    failed_before = sum(r["before"].get("failed", 0) for r in f["final_resume_runs"])
    assert f["outcomes"].get("degraded", 0) + failed_before >= 1, (f["outcomes"], f["final_resume_runs"])
    assert f["final_resumes"] == 1 and f["final_resumes_finished"] == 1, f
    (run_dir,) = map(Path, f["runs"])
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["status"] == "finished" and len(m["resumed"]) >= 1, "the final resume finished the run"

    # The judge can fail: a done point whose records or summary disagree with the ground truth is flagged
    gt = bench_chaos.ground_truth(run_dir.parents[1] / "gt")
    events = _events(out)
    done = next(
        pid
        for pid, p in m["points"].items()
        if p["status"] == "done"
        and not json.loads((run_dir / pid / "summary.json").read_text()).get("degraded")
    )
    _, wrong = bench_chaos.judge(run_dir, gt, events, REQUESTS)
    assert wrong == []

    tokens = tmp_path / "tokens"
    shutil.copytree(run_dir, tokens)
    t = pq.read_table(tokens / done / "records.parquet")
    rows = t.to_pylist()
    i = next(i for i, r in enumerate(rows) if r["error_class"] is None and not r["warmup"])
    rows[i]["completion_tokens"] += 1  # one more token than the emulator sent
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), tokens / done / "records.parquet")
    _, wrong = bench_chaos.judge(tokens, gt, events, REQUESTS)
    assert any(done in w and "tokens differ from the emulator's" in w for w in wrong), wrong

    twice = tmp_path / "twice"
    shutil.copytree(run_dir, twice)
    pq.write_table(pa.Table.from_pylist(rows[:1] + rows, schema=t.schema), twice / done / "records.parquet")
    _, wrong = bench_chaos.judge(twice, gt, events, REQUESTS)
    assert any(done in w and "recorded twice" in w for w in wrong), wrong

    short = tmp_path / "short"
    shutil.copytree(run_dir, short)
    s = json.loads((short / done / "summary.json").read_text())
    s["requests"]["measured"] -= 1  # a request gone, the point not marked
    (short / done / "summary.json").write_text(json.dumps(s))
    _, wrong = bench_chaos.judge(short, gt, events, REQUESTS)
    assert any(done in w and "7 of 8 requests measured, not marked degraded" in w for w in wrong), wrong

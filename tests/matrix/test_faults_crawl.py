"""A server that slows to a crawl (issue 35): every engine step 6 times as long from the moment it is ready, one
configuration of two. Nothing fails: its points complete, and they must not read as fine. What a user checks:
the figures are the truth of what was measured (ITL about 6 times the healthy configuration's at the same load,
every chunk's arrival matching the emulator's own write time), the run's SLO breaks at exactly those points (`run`
exits 1, the table says so), and `servesweep gate` fails them with a verdict while the healthy configuration passes.

The server is the emulator behind a generic launcher (test_faults_hang.faulty_experiment): the `--enable-metrics`
configuration starts with `--sim-crawl-after 0:6` and writes its ground truth."""

from __future__ import annotations

import json
import statistics

import pyarrow.parquet as pq
from support import run_servesweep
from test_faults_hang import faulty_experiment
from test_reliability_server import cleanup, manifest, run_dir_of

from servesweep.sim.groundtruth import read_ground_truth

FACTOR = 6
SLO = "itl_p50<=40ms"  # healthy: ~15 ms; crawling: ~90 ms


def test_a_crawling_server_completes_its_points_and_its_slo_fails_them(tmp_path):
    exp = faulty_experiment(
        tmp_path,
        "crawl",
        f"echo --sim-crawl-after 0:{FACTOR} --sim-ground-truth {tmp_path}/gt-$port.jsonl",
        """\
        concurrency: [1, 2]
        prompt_tokens: [64]
        output_tokens: [40]
        requests: 3
        """,
        f"slo: ['{SLO}']\n",
    )
    runs, srv = tmp_path / "runs", tmp_path / "srv"
    run_dir = None
    try:
        rc, out = run_servesweep("run", str(exp), "--out", str(runs), timeout=400, cwd=tmp_path)
        run_dir = run_dir_of(runs)
        assert rc == 1, out[-3000:]  # an SLO breached at a measured point (servesweep.exit_codes)
        m = manifest(run_dir)
        slow_id, ok_id = list(m["configs"])
        assert all(c["status"] == "done" for c in m["configs"].values())
        by = {(p["config_id"], p["concurrency"]): (pid, p) for pid, p in m["points"].items()}
        ratios = []
        for c in (1, 2):
            slow_pid, slow = by[(slow_id, c)]
            _, fine = by[(ok_id, c)]
            assert slow["status"] == fine["status"] == "done"
            s_slow, s_fine = (json.loads((run_dir / p["dir"] / "summary.json").read_text()) for p in (slow, fine))
            assert s_slow["requests"]["failed"] == s_fine["requests"]["failed"] == 0
            ratio = s_slow["itl_ms"]["p50"] / s_fine["itl_ms"]["p50"]
            assert 0.75 * FACTOR < ratio < 1.25 * FACTOR, (c, s_slow["itl_ms"], s_fine["itl_ms"])
            assert s_slow["ttft_ms"]["p50"] > 2 * s_fine["ttft_ms"]["p50"]
            ratios.append(ratio)
            # the figures are what happened: every record matches the emulator's own account of that request
            gt = {g["id"]: g for f in tmp_path.glob("gt-*.jsonl") for g in read_ground_truth(f)}
            recs = pq.read_table(run_dir / slow_pid / "records.parquet").to_pylist()
            lags = []
            for r in recs:
                g = gt[r["request_id"]]
                assert r["completion_tokens"] == g["completion_tokens"] == 40
                assert r["chunk_tokens"] == [t for _, t in g["chunks"]]
                lags += [
                    (got - wrote) / 1e6 for got, (wrote, _) in zip(r["chunk_ns"], g["chunks"], strict=True)
                ]
            assert 0 <= statistics.median(lags) < 5, statistics.median(lags)
        # the run's exit line names exactly the crawling configuration's points
        slow_pids = [by[(slow_id, c)][0] for c in (1, 2)]
        flat = " ".join(out.split())
        assert f"exit 1: an SLO of the experiment breached at 2 point(s): {', '.join(slow_pids)}" in flat, (
            out[-2000:]
        )
        # the gate: BREACH at those points with a verdict on why; the healthy configuration's points pass
        grc, gout = run_servesweep("gate", str(run_dir), "--json", timeout=120, cwd=tmp_path)
        assert grc == 1, gout[-3000:]
        doc, _ = json.JSONDecoder().raw_decode(gout[gout.index("{") :])
        assert doc["verdict"] == "breach" and doc["line"].startswith("BREACH "), doc["line"]
        failed = {c["point"] for c in doc["checks"] if not c["passed"]}
        assert failed == set(slow_pids), doc["checks"]
        assert {c["point"] for c in doc["checks"] if c["passed"]} == {by[(ok_id, c)][0] for c in (1, 2)}
        assert doc["why"][slow_pids[0]].startswith("decode-bound: ITL/chunk p50"), doc["why"]
        print(
            f"\ncrawl x{FACTOR}: ITL p50 {', '.join(f'{x:.2f}' for x in ratios)} x the healthy configuration's; "
            f"chunks vs the emulator's writes: lag p50 < 5 ms; run exit {rc}, gate exit {grc}: {doc['line']}"
        )
    finally:
        cleanup(None, run_dir, srv)

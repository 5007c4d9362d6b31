"""A degraded point in the Prometheus exporter (issue 35): a point that lost a Locust worker mid-point (one of two
SIGKILLed by the pid of its status file, under `servesweep load --workers 2`, as tests/results/test_degraded.py
does) says so in the exposition a dashboard reads: `servesweep_point_degraded 1`, the concurrency it held against
the one asked, the requests lost, and `servesweep_point_degraded_info{reason=...}` with the text every other surface
shows. A healthy point of the same shape: `servesweep_point_degraded 0`, no reason, its concurrency held."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from servesweep.observe.exporter import ClientMetrics, finished_points
from servesweep.sim.launch import start_sim

sys.path.insert(0, str(Path(__file__).parents[1] / "results"))
from test_compare import servesweep  # noqa: E402
from test_degraded import MODEL, POINT, _run_killing_a_worker  # noqa: E402


def _exposition(run_dir: Path) -> dict[str, list]:
    """The run folder as `servesweep exporter serve` exposes it: family name -> its samples."""
    run_id, _points = finished_points(run_dir)
    m = ClientMetrics(run_id)
    assert m.load_run(run_dir) == 1
    return {f.name: f.samples for f in text_string_to_metric_families(m.text().decode())}


def _value(fams: dict[str, list], name: str) -> float:
    (s,) = fams[name]
    return s.value


def test_a_point_that_lost_a_worker_is_degraded_in_the_exporter(tmp_path):
    with start_sim(
        ["--model-path", MODEL, "--sim-calibration", "speedup=4"], log_path=tmp_path / "sim.log"
    ) as sim:
        deg_root, ok_root = tmp_path / "degraded", tmp_path / "healthy"
        _, killed = _run_killing_a_worker(
            ["load", "--base-url", sim.base_url, "--workers", "2", *POINT, "--out", deg_root],
            deg_root,
            "*/c4/.work/status",
        )
        r = servesweep(
            "load", "--base-url", sim.base_url, "--workers", "2", *POINT, "--out", ok_root, timeout=180
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ((deg_dir,), (ok_dir,)) = (list(d.iterdir()) for d in (deg_root, ok_root))

    deg = _exposition(deg_dir)
    assert _value(deg, "servesweep_point_degraded") == 1.0
    held = _value(deg, "servesweep_point_concurrency_held")
    assert held < 3.5, held  # 4 asked, one of two workers lost
    assert _value(deg, "servesweep_point_lost_requests") >= 1
    (info,) = deg["servesweep_point_degraded_info"]
    reason = info.labels["reason"]
    assert f":{killed} on local" in reason and "exited with 137" in reason, reason
    assert f"concurrency 4 asked, {held:.1f} held" in reason, reason
    assert info.labels["point_id"] == "c4" and info.value == 1.0

    ok = _exposition(ok_dir)
    assert _value(ok, "servesweep_point_degraded") == 0.0
    assert _value(ok, "servesweep_point_lost_requests") == 0.0
    assert _value(ok, "servesweep_point_concurrency_held") > 3.0
    assert not ok.get("servesweep_point_degraded_info")
    print(
        f"\ndegraded point: servesweep_point_degraded 1, concurrency held {held:.2f} of 4; reason: {reason}"
    )

"""summary.json of a point as its model says (results/point_summary.py PointSummary, schema_version 1): a summary
written before the model existed reads back whole; every reader of a run folder (runfolder.load_run: report,
compare, gate, the exporter) refuses a summary with a field missing, of the wrong type or unknown, naming the file
and the field; a save writes the version and only what the model accepts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import run_servesweep

from servesweep.results.point_summary import SCHEMA_VERSION, PointSummary, save_summary
from servesweep.results.runfolder import RunError, load_run

# a real point's summary.json as servesweep wrote it before the model (no schema_version): an emulated packed run's
# point, closed loop at concurrency 2, its needle accuracy added by the run
BEFORE_THE_MODEL = Path(__file__).with_name("summary_v0_point.json")


def _point_folder(tmp_path: Path, change=None) -> Path:
    """A folder of one point holding the real summary, changed by `change` (the JSON dict, in place)."""
    d = tmp_path / "p1"
    d.mkdir()
    data = json.loads(BEFORE_THE_MODEL.read_text())
    if change is not None:
        change(data)
    (d / "summary.json").write_text(json.dumps(data))
    return d


@pytest.mark.fast
def test_a_summary_written_before_the_model_loads_whole():
    raw = json.loads(BEFORE_THE_MODEL.read_text())
    assert "schema_version" not in raw
    s = PointSummary.load(BEFORE_THE_MODEL)
    assert s.point_id == raw["point_id"] and s.ttft_ms is not None and s.ttft_ms.p50 == raw["ttft_ms"]["p50"]
    assert s.requests.ok == 2 and s.failure_check.passed and s.needle_accuracy == 1.0
    # nothing lost, nothing added but the version
    assert s.as_data() == {"schema_version": SCHEMA_VERSION, **raw}


@pytest.mark.fast
def test_the_run_folder_reader_gives_the_checked_summary(tmp_path):
    run = load_run(_point_folder(tmp_path))
    (p,) = run.points
    assert p.summary is not None and p.summary["ttft_ms"]["p99"] == pytest.approx(6.22537128)
    assert p.summary["schema_version"] == SCHEMA_VERSION


@pytest.mark.fast
@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("requests"), "requests"),
        (lambda d: d["ttft_ms"].update(p50="fast"), "ttft_ms.p50"),
        (lambda d: d.update(ttft_p50_ms=6.0), "ttft_p50_ms"),
        (lambda d: d["failure_check"].pop("pass"), "failure_check.pass"),
        (lambda d: d.update(schema_version=2), "schema_version 2"),
    ],
    ids=["missing", "wrong-type", "unknown-key", "nested-missing", "other-version"],
)
def test_a_summary_the_model_refuses_is_named_with_its_field(tmp_path, change, field):
    d = _point_folder(tmp_path, change)
    with pytest.raises(RunError) as e:
        load_run(d)
    assert str(d / "summary.json") in str(e.value) and field in str(e.value)


def test_report_names_the_damaged_summary_and_its_field(tmp_path):
    d = _point_folder(tmp_path, lambda s: s["requests"].update(ok="two"))
    rc, out = run_servesweep("report", str(d), timeout=120)
    assert rc != 0 and "summary.json" in out and "requests.ok" in out, out


@pytest.mark.fast
def test_a_save_writes_the_version_and_refuses_what_a_load_would(tmp_path):
    data = json.loads(BEFORE_THE_MODEL.read_text())
    path = tmp_path / "summary.json"
    written = save_summary(path, data)
    on_disk = json.loads(path.read_text())
    assert on_disk == written and on_disk["schema_version"] == SCHEMA_VERSION
    assert PointSummary.load(path).as_data() == on_disk
    shutil.copy(path, tmp_path / "before.json")
    with pytest.raises(ValueError, match="window_s"):
        save_summary(path, {**data, "window_s": "long"})
    assert path.read_bytes() == (tmp_path / "before.json").read_bytes()  # the file stays as it was


@pytest.mark.fast
def test_the_reports_recomputed_figures_are_the_stored_ones():
    """The report recomputes a point's figures from records.parquet (compare.PointSample: its intervals need the raw
    values, and a bare records file has no summary); the diagnosis it prints reads them from summary.json. One
    definition (results/metrics.py) makes both the same number: this point's summary.json and records.parquet, as
    the run wrote them, agree to the last digit on every figure the report's table shows and summary.json holds."""
    from servesweep.results.compare import PointSample, metric
    from servesweep.results.records import read_parquet

    s = PointSummary.load(BEFORE_THE_MODEL)
    sample = PointSample.from_table(read_parquet(BEFORE_THE_MODEL.with_suffix(".records.parquet")))
    stored = {
        "ttft_p50": s.ttft_ms.p50 if s.ttft_ms else None,
        "ttft_p99": s.ttft_ms.p99 if s.ttft_ms else None,
        "itl_p50": s.itl_ms.p50 if s.itl_ms else None,
        "itl_p99": s.itl_ms.p99 if s.itl_ms else None,
        "itl_per_token_p50": s.itl_per_token_ms.p50 if s.itl_per_token_ms else None,
        "tpot_p50": s.tpot_ms.p50 if s.tpot_ms else None,
        "e2e_p50": s.e2e_ms.p50 if s.e2e_ms else None,
        "output_tokens_per_s": s.output_tokens_per_s,
        "request_rate": s.request_rate,
        "error_rate": s.error_rate,
    }
    recomputed = {name: metric(name).value(sample) for name in stored}
    assert recomputed == pytest.approx(stored, rel=1e-12)


@pytest.mark.fast
def test_nan_and_infinity_stay_as_json_dumps_writes_them(tmp_path):
    """A point with no measured request has no window (NaN); a bound no load reached is infinite: a save and a
    load keep both, as the code before the model wrote them."""
    data = json.loads(BEFORE_THE_MODEL.read_text())
    data.update(window_s=float("nan"), window_ns=[float("nan"), float("nan")], needle_accuracy=float("inf"))
    save_summary(tmp_path / "summary.json", data)
    text = (tmp_path / "summary.json").read_text()
    assert '"window_s": NaN' in text and '"needle_accuracy": Infinity' in text
    s = PointSummary.load(tmp_path / "summary.json")
    assert s.window_s != s.window_s and s.needle_accuracy == float("inf")

"""The report's table reads a point's figures where they are, once: a run's point from its summary.json (issue 29:
TTFT p50 was stored in summary.json, copied into the manifest and recomputed by the report), a bare records file
(no summary.json) from its records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesweep.results.compare import PointSample, metric
from servesweep.results.records import read_parquet
from servesweep.results.report import point_row
from servesweep.results.runfolder import load_run

SUMMARY = Path(__file__).with_name("summary_v0_point.json")
RECORDS = SUMMARY.with_suffix(".records.parquet")


@pytest.mark.fast
def test_a_points_row_says_what_its_summary_says(tmp_path):
    folder = tmp_path / "point"
    folder.mkdir()
    shutil.copyfile(RECORDS, folder / "records.parquet")
    data = json.loads(SUMMARY.read_text())
    # a figure the records would not give: the row must show the summary's, not a recomputed one
    data["ttft_ms"]["p50"], data["output_tokens_per_s"], data["requests"]["failed"] = 4321.5, 765.25, 3
    (folder / "summary.json").write_text(json.dumps(data))
    (p,) = load_run(folder).points
    row = point_row(p)
    assert row.values["ttft_p50"] == 4321.5 and row.values["output_tokens_per_s"] == 765.25 and row.failed == 3
    assert row.samples["ttft_p50"] == data["ttft_ms"]["n"]
    assert row.itl, "the ITL distribution the plot draws comes from the records"


@pytest.mark.fast
def test_a_bare_records_files_row_comes_from_its_records(tmp_path):
    shutil.copyfile(RECORDS, tmp_path / "r.parquet")
    (p,) = load_run(tmp_path / "r.parquet").points
    row = point_row(p)
    sample = PointSample.from_table(read_parquet(RECORDS))
    assert row.values["ttft_p50"] == metric("ttft_p50").value(sample)
    assert row.ok == int(sample.ok.sum())

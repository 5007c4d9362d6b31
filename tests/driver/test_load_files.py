"""`servesweep load`'s manifest.json and an interrupted point's interrupted.json as their models say
(driver/load.py LoadManifestFile, driver/point_run.py InterruptedFile; schema_version 1): the files servesweep wrote
before the models (a 3-point sweep stopped by SIGINT in its second point, then resumed) load whole, `--resume`
takes such a run up, and a damaged file is refused naming the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesweep.driver.load import LoadManifestFile, _resume_state, load_manifest, resumed_argv
from servesweep.driver.point_run import InterruptedFile
from servesweep.exit_codes import BadOption

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

HERE = Path(__file__).parent
INTERRUPTED = HERE / "load_manifest_v0_interrupted.json"  # --concurrency 1,2,3 --workers 2, SIGINT during c2
RESUMED = HERE / "load_manifest_v0_resumed.json"  # the same run after --resume finished it
INTERRUPTED_POINT = HERE / "interrupted_v0.json"  # c2's interrupted.json


@pytest.mark.parametrize("before", [INTERRUPTED, RESUMED], ids=["interrupted", "resumed"])
def test_a_load_manifest_written_before_the_model_loads_whole(tmp_path, before):
    raw = json.loads(before.read_text())
    shutil.copy(before, tmp_path / "manifest.json")
    m = load_manifest(tmp_path)
    assert m.as_data() == {"schema_version": 1, **raw}  # nothing lost, nothing added
    assert resumed_argv(tmp_path) == raw["argv"][1:]
    if before is INTERRUPTED:
        assert m.status == "interrupted" and m.interrupted and m.interrupted.point == "c2"
        assert m.points[1].partial and m.points[1].partial.records == "records.partial.parquet"
    else:
        assert m.status is None and m.finished_unix and [p.point_id for p in m.points] == ["c1", "c2", "c3"]
        assert m.interruptions[0].points[0].dir == "c2.interrupted" and m.resumed[0].base_url


def test_resume_of_a_run_stopped_before_the_model(tmp_path):
    """The interrupted run's manifest (with c1's summary gone: measured again) made ready to go on: c2's folder
    moved aside and listed under `interruptions`, the stop itself no longer the run's status."""
    shutil.copy(INTERRUPTED, tmp_path / "manifest.json")
    (tmp_path / "c2").mkdir()
    shutil.copy(INTERRUPTED_POINT, tmp_path / "c2" / "interrupted.json")
    m, kept, left = _resume_state(tmp_path, [])
    assert kept == [] and left == []
    d = m.as_data()
    assert "status" not in d and "interrupted" not in d and d["points"] == []  # c1 has no summary.json here
    (past,) = d["interruptions"]
    assert past["signal"] == "SIGINT" and past["points"][0]["dir"] == "c2.interrupted"
    assert (tmp_path / "c2.interrupted" / "interrupted.json").is_file() and len(d["resumed"]) == 1
    LoadManifestFile.check(tmp_path / "manifest.json", d)  # what the resume saves, its load accepts


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["points"][0].pop("dir"), "points.0.dir"),
        (lambda d: d["points"][1]["partial"].update(rows="many"), "points.1.partial.rows"),
        (lambda d: d["interrupted"].update(when=1), "interrupted.when"),
    ],
    ids=["missing", "wrong-type", "unknown-key"],
)
def test_a_damaged_load_manifest_is_named_with_its_field(tmp_path, change, field):
    raw = json.loads(INTERRUPTED.read_text())
    change(raw)
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BadOption) as e:
        resumed_argv(tmp_path)
    assert str(tmp_path / "manifest.json") in str(e.value) and field in str(e.value)


def test_a_run_folder_of_servesweep_run_is_not_resumed_by_load(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "r", "points": {}}))
    with pytest.raises(BadOption, match="servesweep run --resume"):
        resumed_argv(tmp_path)


def test_an_interrupted_json_written_before_the_model_loads_and_a_damaged_one_is_named(tmp_path):
    raw = json.loads(INTERRUPTED_POINT.read_text())
    info = InterruptedFile.load(INTERRUPTED_POINT)
    assert info.as_data() == {"schema_version": 1, **raw} and info.rows == 0
    f = tmp_path / "interrupted.json"
    f.write_text(json.dumps({**raw, "rows": "none"}))
    with pytest.raises(ValueError) as e:
        InterruptedFile.load(f)
    assert str(f) in str(e.value) and "rows" in str(e.value)

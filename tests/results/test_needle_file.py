"""answers/<config>.json, a configuration's needle probes, as its model says (results/needle_file.py
NeedleProbesFile, schema_version 1): a file written before the model reads back whole; one with a field missing or of
the wrong type is refused naming the file and the field; a save writes the version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesweep.results.needle_file import NeedleProbesFile, probes_path, read_all_probes, save_probes

# a real configuration's probe file as servesweep wrote it before the model (an emulated packed run, 2 lengths)
BEFORE_THE_MODEL = Path(__file__).with_name("needle_probes_v0.json")


@pytest.mark.fast
def test_a_probe_file_written_before_the_model_loads_whole(tmp_path):
    raw = json.loads(BEFORE_THE_MODEL.read_text())
    f = probes_path(tmp_path, raw["config_id"])
    f.parent.mkdir()
    shutil.copy(BEFORE_THE_MODEL, f)
    got = read_all_probes(tmp_path)
    assert got == {raw["config_id"]: {"schema_version": 1, **raw}}
    m = NeedleProbesFile.load(f)
    assert all(p.correct for p in m.probes) and {v.needle_accuracy for v in m.lengths.values()} == {1.0}


@pytest.mark.fast
@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["probes"][0].pop("correct"), "probes.0.correct"),
        (lambda d: next(iter(d["lengths"].values())).update(n="all"), ".n"),
        (lambda d: d.pop("config_id"), "config_id"),
    ],
    ids=["probe-missing", "wrong-type", "top-missing"],
)
def test_a_damaged_probe_file_is_named_with_its_field(tmp_path, change, field):
    raw = json.loads(BEFORE_THE_MODEL.read_text())
    change(raw)
    f = probes_path(tmp_path, "c1")
    f.parent.mkdir()
    f.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as e:
        read_all_probes(tmp_path)
    assert str(f) in str(e.value) and field in str(e.value)


@pytest.mark.fast
def test_save_writes_the_version_where_the_readers_look(tmp_path):
    raw = json.loads(BEFORE_THE_MODEL.read_text())
    written = save_probes(tmp_path, raw)
    f = probes_path(tmp_path, raw["config_id"])
    assert json.loads(f.read_text()) == written and written["schema_version"] == 1
    assert read_all_probes(tmp_path)[raw["config_id"]] == written

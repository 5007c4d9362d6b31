"""manifest.json of `servesweep run` as its model says (results/manifest.py ManifestFile, schema_version 1): a new
run's manifest reads back whole, a closed-loop point's entry without `rate`; `servesweep run --resume` refuses a
manifest it cannot trust (another schema version, an entry without a field, an undeclared key, a stored experiment
that is no longer valid) naming the file and the field, and leaves the folder as it was; a save never writes what a
resume would refuse."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from support import emulator_experiment_head, run_servesweep

from servesweep.config.experiment import load_experiment
from servesweep.matrix import run_setup
from servesweep.results import manifest as mf

# manifest.json of a packed run (2 bundles side by side, the isolation sample, 6 points done) as servesweep wrote it
# before the model existed (commit 7a29dee), its servers' /server_info documents emptied to keep the file small
BEFORE_THE_MODEL = Path(__file__).with_name("manifest_v1_packed.json")


@pytest.fixture
def run_dir(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text(
        emulator_experiment_head(tmp_path, "mftest")
        + textwrap.dedent(
            """\
            load: {concurrency: [1, 2], prompt_tokens: 100, output_tokens: 4, requests: 2}
            """
        )
    )
    return run_setup.create_run(load_experiment(f), tmp_path / "runs", experiment_file=str(f)).run_dir


def _resume(run_dir) -> tuple[int, str]:
    return run_servesweep("run", "--resume", str(run_dir), timeout=120)


def test_a_new_runs_manifest_reads_back_whole(run_dir):
    raw = json.loads((run_dir / "manifest.json").read_text())
    assert raw["schema_version"] == mf.SCHEMA_VERSION and raw["status"] == "created"
    # the keys a later stage sets are absent until it sets them, as the code before the model wrote them
    assert not {"exporter", "resumed", "packing", "searches", "error", "max_parallel"} & set(raw)
    m = mf.Manifest.load(run_dir)
    assert m.run_id == run_dir.name and m.status == "created" and m.port == raw["port"] and not m.dry_run
    assert m.experiment().name == "mftest" and m.experiment().sglang_version == "0.5.23"
    assert sorted(p["concurrency"] for p in m.points.values()) == [1, 2]
    for pid, p in m.points.items():
        assert p["status"] == mf.PENDING and p["attempts"] == 0 and p["dir"] is None
        assert "result" not in p  # a point's figures are its summary.json's alone, never copied here
        assert p["point"]["workload_name"] == p["workload"] == "chat"  # the LoadPoint says what reports group by
        assert "rate" not in p  # a closed-loop point has no arrival rate (the results table shows none)
        assert p["point"]["point_id"] == pid
    cfg = next(iter(m.configs.values()))
    assert cfg["status"] == "pending" and cfg["server"] is None and cfg["attempts"] == 0


def test_a_resume_refuses_a_stored_experiment_that_is_no_longer_valid(run_dir):
    """The check across fields ("sglang_version is required unless launcher.command is set") is the model's own:
    the experiment a manifest stored gets it on resume too, before anything starts."""
    path = run_dir / "manifest.json"
    raw = json.loads(path.read_text())
    raw["experiment"]["sglang_version"] = None
    path.write_text(json.dumps(raw, indent=2))
    before = path.read_bytes()
    rc, out = _resume(run_dir)
    assert rc == 2, out
    assert (
        f"{path}: not a valid servesweep run manifest: experiment.sglang_version: required key is missing (the "
        "SGLang version the flags are rendered for)"
    ) in out
    assert path.read_bytes() == before  # nothing resumed, nothing rewritten
    assert sorted(p.name for p in run_dir.iterdir()) == ["manifest.json"]


def test_a_resume_refuses_a_manifest_it_cannot_trust(run_dir):
    path = run_dir / "manifest.json"
    raw = json.loads(path.read_text())
    pid = next(iter(raw["points"]))
    entry = raw["points"][pid]
    cases = [
        ({**raw, "schema_version": 0}, f"{path}: schema_version 0, expected 1"),
        (
            {**raw, "points": {pid: {k: v for k, v in entry.items() if k != "config_id"}}},
            f"{path}: not a valid servesweep run manifest: points.{pid}.config_id: Field required",
        ),
        (
            {**raw, "points": {pid: {**entry, "status": "half-done"}}},
            f"{path}: not a valid servesweep run manifest: points.{pid}.status: Input should be 'done', ",
        ),
    ]
    for doc, says in cases:
        path.write_text(json.dumps(doc))
        with pytest.raises(ValueError) as ei:
            mf.Manifest.load(run_dir)
        assert says in str(ei.value)
    rc, out = _resume(run_dir)  # the last one, through the command a user runs
    assert rc == 2 and f"points.{pid}.status: Input should be" in out, out


def test_a_save_never_writes_what_a_resume_would_refuse(run_dir):
    m = mf.Manifest.load(run_dir)
    before = m.path.read_text()
    pid = next(iter(m.points))
    m.points[pid]["stauts"] = mf.DONE  # a key no stage declares (a typo)
    with pytest.raises(ValueError, match=rf"points\.{pid}\.stauts: Extra inputs are not permitted"):
        m.save()
    assert m.path.read_text() == before  # the previous manifest stays, whole
    del m.points[pid]["stauts"]
    m.points[pid].update(status=mf.RUNNING, attempts=1, started=mf.now_iso(), cache_flushed=None)
    m.status = "running"
    m.resumed_now()
    m.save()
    again = mf.Manifest.load(run_dir)
    assert (
        again.points[pid]["status"] == mf.RUNNING
        and again.status == "running"
        and len(again.data["resumed"]) == 1
    )


def test_lanes_saving_side_by_side_leave_a_whole_manifest(run_dir):
    """A packed run's lanes change their own entries (update_point, update_config) and save from their own threads
    (matrix/packed.py): each change and each save is made under the manifest's one lock, so none fails and the last
    file holds every lane's last change."""
    import threading

    m = mf.Manifest.load(run_dir)
    pids, cids = list(m.points), list(m.configs)
    errors: list[BaseException] = []

    def lane(n: int) -> None:
        try:
            for i in range(30):
                m.update_point(pids[n % len(pids)], status=mf.RUNNING, attempts=i, started=mf.now_iso())
                m.update_config(cids[0], restarts=i)
                m.add_event(f"lane {n} step {i}")
                m.save()
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=lane, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    m.save()
    again = mf.Manifest.load(run_dir)
    assert all(p["status"] == mf.RUNNING and p["attempts"] == 29 for p in again.points.values())
    assert len(again.data["events"]) == 6 * 30 and again.configs[cids[0]]["restarts"] == 29


def test_a_manifest_written_before_the_model_loads_and_saves_as_it_was(tmp_path):
    """Same keys, schema_version 1: a run folder of the code before the model resumes as it is (the format is the
    one ManifestFile declares, not a new version); its points' copies of their summaries' headlines (`result`,
    written before issue 29) load and are dropped."""
    run_dir = tmp_path / "packed-run"
    run_dir.mkdir()
    shutil.copyfile(BEFORE_THE_MODEL, run_dir / "manifest.json")
    before = json.loads(BEFORE_THE_MODEL.read_text())
    m = mf.Manifest.load(run_dir)
    assert m.status == "finished" and m.counts() == {mf.DONE: 6} and m.max_parallel == 2
    assert m.packing is not None and len(m.packing["placements"]) == 2 and m.exporter is not None
    assert sum(1 for p in m.points.values() if p.get("isolation_of")) == 2  # the alone twins
    assert all("result" in p for p in before["points"].values())  # the headline copy it was written with
    m.save()
    after = json.loads((run_dir / "manifest.json").read_text())
    assert after.keys() == before.keys() and after["updated"] != before["updated"]
    # saved as it was, less the copy of each summary's headline (a point's figures are its summary.json's)
    for p in before["points"].values():
        del p["result"]
    assert {k: v for k, v in after.items() if k != "updated"} == {
        k: v for k, v in before.items() if k != "updated"
    }


def test_an_entry_changes_only_through_a_checked_update(run_dir):
    """A point is read typed and changed through update_point: a key the model lacks, a status it does not know or
    an axis that is not the point's is refused, naming it, and nothing changes."""
    from pydantic import ValidationError

    m = mf.Manifest.load(run_dir)
    pid = next(iter(m.points))
    for bad, named in (({"statu": "done"}, "statu"), ({"status": "finished"}, "status"), ({"concurrency": 7}, "differ from the point")):
        with pytest.raises(ValidationError, match=named):
            m.update_point(pid, **bad)
    assert m.point(pid).status == mf.PENDING and "statu" not in m.points[pid]
    assert m.points[pid]["concurrency"] == m.points[pid]["point"]["concurrency"]
    new = m.update_point(pid, status=mf.RUNNING, attempts=1)
    assert new.status == m.point(pid).status == mf.RUNNING and m.point(pid).attempts == 1
    cid = m.point(pid).config_id
    with pytest.raises(ValidationError, match="status"):
        m.update_config(cid, status="gone")
    assert m.update_config(cid, restarts=2).restarts == m.config(cid).restarts == 2

"""Energy at SLO capacity (issue 31): the probes' gpu.json pooled into each capacity row, the capacity table's energy
columns, the energy frontier, compare's tokens per joule, and `gate --min-capacity` energy bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesweep.results import capacity
from servesweep.results.energy import point_gpu

pytestmark = pytest.mark.fast


def _gpu_json(power_w: float, seconds: float, output_tokens: int, throttle: int = 0) -> dict:
    """gpu.json of one probe: one GPU at a constant power, its counter exact, an idle stretch before the window."""
    samples = []
    for i in range(int((seconds + 20) * 2) + 1):
        t = i / 2
        busy = t >= 10
        p = power_w if busy else 100.0
        e = 100.0 * min(t, 10) + power_w * max(0.0, t - 10)
        samples.append({"t": t, "gpus": [{"index": 0, "name": "H200", "uuid": "GPU-0", "util_pct": 80 if busy else 0,
                                          "power_w": p, "energy_mj": e * 1000, "energy_source": "counter",
                                          "throttle_reasons": throttle if busy else 0}]})  # fmt: skip
    return point_gpu([{"sampler": "http://h:1", "source": "sim", "samples": samples}], 10.0, 10.0 + seconds,
                     output_tokens=output_tokens, total_tokens=output_tokens * 3)  # fmt: skip


def _row(search: str, config: str, cap_load, bracket) -> dict:
    return {"search": search, "config": config, "workload": "chat", "prompt_tokens": 64, "output_tokens": 8,
            "gpus": 1, "axis": "concurrency", "tier": "fast", "slos": [], "capacity": cap_load, "bracket": bracket,
            "stop": "resolution", "binding": "ttft_p99<=1s", "probes": 3,
            "at_capacity": {"output_tokens_per_s": 500.0, "output_tokens_per_s_per_gpu": 500.0}}  # fmt: skip


def _run(tmp: Path, name: str, probes: dict[tuple[str, int], list[dict | None]], rows, frontier) -> Path:
    """A run folder as capacity_run leaves it: the manifest's probe points, their gpu.json, capacity.json."""
    run = tmp / name
    points = {}
    for (search, load), docs in probes.items():
        for n, doc in enumerate(docs, 1):
            pid = f"{search}-c{load}-n{n}"
            (run / pid).mkdir(parents=True)
            if doc is not None:
                (run / pid / "gpu.json").write_text(json.dumps(doc))
            points[pid] = {"status": "done", "dir": pid, "search": search, "load": load}
    (run / "manifest.json").write_text(json.dumps({"schema_version": 1, "run_id": name, "points": points}))
    (run / "capacity.json").write_text(json.dumps({"run_id": name, "axis": "concurrency", "rows": rows,
                                                   "frontier": frontier, "probes": 5, "grid_points": 8}))  # fmt: skip
    return run


def _fr(search, config, load, tps):
    return {"search": search, "config": config, "load": load, "tokens_per_s_per_gpu": tps, "user_tokens_per_s": 50.0,
            "pareto": True}  # fmt: skip


@pytest.fixture
def runs(tmp_path):
    # search a: capacity 8 measured twice (600 W over 10 s for 5,000 tokens, then 600 W over 20 s for 10,000):
    # pooled 18,000 J for 15,000 tokens = 1.2 J per output token; load 4: 400 W, 10 s, 4,000 tokens = 1.0 J/tok
    a_probes = {("a", 8): [_gpu_json(600, 10, 5000), _gpu_json(600, 20, 10000)], ("a", 4): [_gpu_json(400, 10, 4000)],
                # search b: its capacity's probe throttled (thermal); its other probe had no sampler
                ("b", 2): [_gpu_json(300, 10, 1000, throttle=0x20)], ("b", 16): [None]}  # fmt: skip
    rows = [_row("a", "tp1", 8, [8, 9]), _row("b", "tp2", 2, [2, 3]), _row("c", "tp4", None, [None, 1])]
    frontier = [_fr("a", "tp1", 8, 1500.0), _fr("a", "tp1", 4, 400.0), _fr("b", "tp2", 2, 100.0),
                _fr("b", "tp2", 16, 2000.0)]  # fmt: skip
    a = _run(tmp_path, "A", a_probes, rows, frontier)
    # B: search a at capacity 8 draws 700 W over 10 s for 5,000 tokens: 1.4 J per output token
    b = _run(tmp_path, "B", {("a", 8): [_gpu_json(700, 10, 5000)]}, [_row("a", "tp1", 8, [8, 9])],
             [_fr("a", "tp1", 8, 1500.0)])  # fmt: skip
    return a, b


def test_energy_at_capacity_pools_every_call_of_the_capacity_probe(runs):
    cap = capacity.load_capacity(runs[0])
    a, b, c = cap["rows"]
    assert a["energy"]["calls"] == 2
    assert a["energy"]["joules_per_output_token"] == pytest.approx(1.2, rel=1e-6)
    assert a["energy"]["output_tokens_per_joule"] == pytest.approx(1 / 1.2, rel=1e-6)
    assert a["energy"]["joules_per_token"] == pytest.approx(0.4, rel=1e-6)  # total tokens: 3 x output
    assert a["energy"]["power_avg_w"] == pytest.approx(600, rel=1e-6)
    assert a["energy"]["capacity_per_kw"] == pytest.approx(8 / 0.6, rel=1e-6)
    # above idle: 100 W idle baseline per GPU, from the samples at 0% before the window
    assert a["energy"]["joules_per_output_token_above_idle"] == pytest.approx(1.0, rel=1e-6)
    assert b["energy"]["throttled"] and b["energy"]["throttle_reasons"] == ["sw_thermal_slowdown"]
    assert c["energy"] is None  # no capacity: no probe to read

    cells = dict(zip(capacity.HEADER, capacity.table_rows(cap)[0], strict=True))
    assert (cells["J/out tok"], cells["out tok/J"], cells["avg W"], cells["cap/kW"]) == (
        "1.200",
        "0.83",
        "600",
        "13.3",
    )
    b_cells = dict(zip(capacity.HEADER, capacity.table_rows(cap)[1], strict=True))
    assert b_cells["J/out tok"] == "3.000!"  # throttled
    assert capacity.table_rows(cap)[2][-4:] == ["-", "-", "-", "-"]
    md = "\n".join(capacity.markdown(cap))
    assert "b/fast: GPU throttled at capacity (sw_thermal_slowdown)" in md


def test_energy_frontier_marks_the_probes_no_other_beats_on_both(runs, tmp_path):
    cap = capacity.load_capacity(runs[0])
    by = {(p["search"], p["load"]): p for p in cap["frontier"]}
    # a@8: 1,500 tok/s/GPU at 0.83 tok/J; a@4: 400 at 1.0 tok/J; b@2: 100 at 0.33 (dominated); b@16: no telemetry
    assert by[("a", 4)]["output_tokens_per_joule"] == pytest.approx(1.0)
    assert {k for k, p in by.items() if p["energy_pareto"]} == {("a", 8), ("a", 4)}
    assert by[("b", 16)]["output_tokens_per_joule"] is None and not by[("b", 16)]["energy_pareto"]
    assert by[("b", 2)]["throttled"]
    svg = capacity.energy_frontier_svg(cap)
    assert svg.startswith("<svg") and "energy Pareto frontier" in svg and "GPU throttled" in svg
    capacity.write_frontier_svg(runs[0], json.loads((runs[0] / "capacity.json").read_text()))
    assert (runs[0] / capacity.ENERGY_FRONTIER_SVG).is_file() and (runs[0] / capacity.FRONTIER_SVG).is_file()
    assert "Energy frontier" in "\n".join(capacity.markdown(cap))


def test_no_telemetry_leaves_every_energy_figure_out(tmp_path):
    run = _run(tmp_path, "N", {("a", 8): [None]}, [_row("a", "tp1", 8, [8, 9])], [_fr("a", "tp1", 8, 10.0)])
    cap = capacity.load_capacity(run)
    assert cap["rows"][0]["energy"] is None and not capacity.has_energy(cap)
    assert capacity.energy_notes(cap) == []
    with pytest.raises(ValueError, match="needs GPU telemetry at capacity"):
        capacity.gate(run, "output_tokens_per_joule>=1", None)


def test_compare_shows_tokens_per_joule_of_both_runs(runs):
    a, b = (capacity.load_capacity(r) for r in runs)
    (row,) = capacity.compare(a, b)
    assert row["a_tok_per_joule"] == pytest.approx(1 / 1.2) and row["b_tok_per_joule"] == pytest.approx(
        1 / 1.4
    )
    from rich.console import Console

    con = Console(record=True, width=200)
    capacity.print_compare(con, runs[0], runs[1])
    assert "0.83 → 0.71" in con.export_text()


def test_gate_energy_bounds(runs):
    a_dir, b_dir = runs
    res = capacity.gate(a_dir, "output_tokens_per_joule>=0.8", None)
    assert [(n, ok) for n, _c, ok, _m in res] == [("a/fast", True), ("b/fast", False), ("c/fast", False)]
    assert "0.3333 vs required >= 0.8" in res[1][3] and "no capacity" in res[2][3]
    # a load and an energy bound together, comma-separated
    res = capacity.gate(a_dir, "8, joules_per_output_token<=1.25", None)
    assert [(c, ok) for n, c, ok, _m in res if n == "a/fast"] == [
        ("capacity >= 8", True), ("joules_per_output_token <= 1.25", True)]  # fmt: skip
    # against a baseline: B's 1.4 J per output token is more than 110% of A's 1.2
    (r,) = capacity.gate(b_dir, "joules_per_output_token<=110%", a_dir)
    assert r[2] is False and "1.4 vs required <= 1.32" in r[3]
    (r,) = capacity.gate(b_dir, "joules_per_output_token<=120%", a_dir)
    assert r[2] is True


@pytest.mark.parametrize(
    "text,match",
    [("watts<=3", "unknown energy metric 'watts'"), ("fast", "neither a load"), ("8, 9", "two loads"),
     ("output_tokens_per_joule>=x", "'x' is not a number"), ("", "nothing to check")],
)  # fmt: skip
def test_gate_terms_that_cannot_be_read_say_which(runs, text, match):
    with pytest.raises(ValueError, match=match):
        capacity.gate(runs[0], text, None)


def test_a_percentage_needs_a_baseline(runs):
    with pytest.raises(ValueError, match="needs --baseline"):
        capacity.gate(runs[0], "output_tokens_per_joule>=90%", None)


@pytest.mark.fast
def test_capacity_json_before_the_model_loads_and_a_damaged_one_is_named_with_its_field(runs):
    raw = json.loads((runs[0] / capacity.CAPACITY_JSON).read_text())
    assert (
        "schema_version" not in raw and "load_unit" not in raw["rows"][0]
    )  # as capacity_run wrote it before
    assert capacity.CapacityFile.load(runs[0] / capacity.CAPACITY_JSON).as_data() == {
        "schema_version": 1,
        **raw,
    }
    raw["rows"][1]["capacity"] = "two"
    (runs[0] / capacity.CAPACITY_JSON).write_text(json.dumps(raw))
    for read in (lambda: capacity.load_capacity(runs[0]), lambda: capacity.gate(runs[0], "2", None)):
        with pytest.raises(ValueError) as e:
            read()
        assert str(runs[0] / "capacity.json") in str(e.value) and "rows.1.capacity" in str(e.value)


@pytest.mark.fast
def test_save_capacity_writes_the_version_and_refuses_an_undeclared_key(runs, tmp_path):
    cap = json.loads((runs[0] / capacity.CAPACITY_JSON).read_text())
    written = capacity.save_capacity(tmp_path, cap)
    assert json.loads((tmp_path / "capacity.json").read_text()) == written and written["schema_version"] == 1
    with pytest.raises(ValueError, match="frontier.0.tok_s"):
        capacity.save_capacity(tmp_path, {**cap, "frontier": [{**cap["frontier"][0], "tok_s": 1.0}]})
    assert json.loads((tmp_path / "capacity.json").read_text()) == written  # the file stays as it was


# what a dry run of examples/qwen36-27b-rtxpro6000-search.yaml wrote before the models (results/capacity.py
# CapacityFile, SearchFile): its capacity.json and its one search's searches/<search>.json
CAPACITY_BEFORE = Path(__file__).with_name("capacity_v0_dryrun.json")
SEARCH_BEFORE = Path(__file__).with_name("search_v0_dryrun.json")


@pytest.mark.fast
def test_real_capacity_and_search_files_from_before_the_models_load_whole(tmp_path):
    cap_raw = json.loads(CAPACITY_BEFORE.read_text())
    (tmp_path / capacity.CAPACITY_JSON).write_text(CAPACITY_BEFORE.read_text())
    assert capacity.CapacityFile.load(tmp_path / capacity.CAPACITY_JSON).as_data() == {
        "schema_version": 1,
        **cap_raw,
    }
    raw = json.loads(SEARCH_BEFORE.read_text())
    capacity.search_path(tmp_path, raw["search"]).parent.mkdir()
    capacity.search_path(tmp_path, raw["search"]).write_text(SEARCH_BEFORE.read_text())
    got = capacity.load_search(tmp_path, raw["search"])
    # its probes' judgements hold infinite bounds: they come back as written (json.dumps's Infinity)
    assert json.dumps(got, sort_keys=True) == json.dumps({"schema_version": 1, **raw}, sort_keys=True)
    assert got["rows"] == cap_raw["rows"]  # capacity.json's rows are the search's


@pytest.mark.fast
def test_a_search_file_with_a_damaged_row_is_named_with_its_field(tmp_path):
    raw = json.loads(SEARCH_BEFORE.read_text())
    del raw["rows"][0]["bracket"]
    with pytest.raises(ValueError) as e:
        capacity.save_search(tmp_path, raw)
    assert f"{raw['search']}.json" in str(e.value)
    assert "rows.0.bracket" in str(e.value) and not capacity.search_path(tmp_path, raw["search"]).exists()

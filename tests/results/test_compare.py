"""servesweep compare on real run folders: `servesweep run` against the emulator, once at full speed and once with a
slower step model (`--sim-calibration bw_eff=...`: a GPU that streams weights at under half the bandwidth). The
slower run must come out "worse" on tok/s and ITL with intervals that exclude zero; a run against itself is within
noise.

The helpers at the top also serve test_report.py and test_gates.py: the run folders are made once per session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support import refused_port

from servesweep.results.compare import DEFAULT_METRICS, compare_runs, load_run, metric, weighted_percentile
from servesweep.sim.launch import start_sim

SIM_BASE = ["--model-path", "Qwen/Qwen3.6-27B", "--context-length", "2048", "--sim-load-time", "0"]
SLOW = ["--sim-calibration", "bw_eff=0.35"]  # weight streaming at under half the default efficiency


def servesweep(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The real CLI in a child process (exit codes and output as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "servesweep.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )


def experiment_yaml(
    path: Path,
    name: str,
    base_url: str,
    *,
    concurrency: list[int],
    prompt_tokens: list[int],
    output_tokens: int,
    requests: int,
    slo: list[str] = (),
    first_token_s: float = 900.0,
) -> Path:
    """An experiment against an existing server (no Ansible: the test starts the emulator itself)."""
    slo_text = "".join(f"\n  - {json.dumps(s)}" for s in slo) if slo else " []"
    path.write_text(
        textwrap.dedent(
            f"""\
            name: {name}
            sglang_version: "0.5.23"
            target:
              base_url: {base_url}
            model:
              path: Qwen/Qwen3.6-27B
            launcher:
              emulator: true
              gpu: H200
            server:
              base:
                context_length: 2048
            load:
              workload: chat
              concurrency: {concurrency}
              prompt_tokens: {prompt_tokens}
              output_tokens: {output_tokens}
              requests: {requests}
              first_token_s: {first_token_s}
            flush_cache_between_points: false
            answers:
              needle_probes: false  # these modules read points; needle probes at real time cost 10-30 s a run
            """
        )
        + f"slo:{slo_text}\n"
    )
    return path


def run_experiment(root: Path, name: str, sim_args: list[str] | None, **load) -> Path:
    """`servesweep run` of a small experiment against a fresh emulator (sim_args None: no server at all)."""
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{name}-runs"
    t0 = time.monotonic()
    if sim_args is None:
        with refused_port() as port:  # held: nothing else can listen there meanwhile
            url = f"http://127.0.0.1:{port}"
            r = servesweep("run", experiment_yaml(root / f"{name}.yaml", name, url, **load), "--out", out)
    else:
        with start_sim(SIM_BASE + sim_args, log_path=root / f"{name}-sim.log") as sim:
            r = servesweep(
                "run", experiment_yaml(root / f"{name}.yaml", name, sim.base_url, **load), "--out", out
            )
    # 1: an SLO of the experiment breached; 2 (could not run: points not measured) only for the dead server's run
    want = (2,) if name == "dead" else (0, 1)
    assert r.returncode in want, f"servesweep run {name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    (run_dir,) = list(out.iterdir())
    print(f"servesweep run {name}: {time.monotonic() - t0:.1f} s")
    return run_dir


def cached_runs(tmp_path_factory, key: str, make) -> dict[str, Path]:
    """Make run folders once per test session (all three modules use them, read-only); `make(root)` returns a dict.
    Under pytest-xdist each worker has its own base folder and the modules land on different workers, so the folders
    live in the session's shared parent, made by the first worker that asks while the others wait on a lock."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / f"servesweep-{key}"
    done = root / "done.json"
    with FileLock(str(base / f"servesweep-{key}.lock")):
        if not done.is_file():
            runs = make(root)
            done.write_text(json.dumps({k: str(v) for k, v in runs.items()}))
    return {k: Path(v) for k, v in json.loads(done.read_text()).items()}


def all_runs(tmp_path_factory) -> dict[str, Path]:
    """The run folders every module uses, made once per session:

    fast: `servesweep run`, concurrency 1 and 4 × prompt 256 and 1024 (+ 4096, infeasible at the 2048 context);
    slow: the same server on a slower step model, concurrency 4 only (its points match two of fast's);
    dead: `servesweep run` against a port that refuses connections (a failed and a server_failed point);
    load: `servesweep load`, one point, a quarter of the requests stalled past the client's first-token timeout.
    """

    def make(root: Path) -> dict[str, Path]:
        load = dict(prompt_tokens=[256, 1024, 4096], output_tokens=16, requests=6,
                    slo=["ttft_p99<=30s", "error_rate<=1%"])  # fmt: skip
        runs = {
            "fast": run_experiment(root, "fast", [], concurrency=[1, 4], **load),
            "slow": run_experiment(root, "slow", SLOW, concurrency=[4], **load),
            "dead": run_experiment(
                root, "dead", None, concurrency=[1, 2], prompt_tokens=[256], output_tokens=8, requests=2
            ),  # fmt: skip
        }
        t0 = time.monotonic()
        # no byte for 2 s on a quarter of the requests; the client gives up after 1 s (timeout_first_token).
        # (A fault answering 500 would also hit the load core's probes and fail the whole point.)
        with start_sim(
            SIM_BASE + ["--sim-fault-rate", "slow_first_byte:2=0.25"], log_path=root / "load-sim.log"
        ) as sim:
            r = servesweep(
                "load", "--base-url", sim.base_url, "--concurrency", "2", "--prompt-tokens", "256",
                "--output-tokens", "16", "--requests", "10", "--first-token-timeout", "1s", "--slo", "error_rate<=90%",
                "--max-failure-rate", "100%",  # the stalled quarter is the point of this run, not a failure of it
                "--out", root / "load-runs",
            )  # fmt: skip
        assert r.returncode == 0, r.stderr
        (runs["load"],) = list((root / "load-runs").iterdir())
        print(f"servesweep load: {time.monotonic() - t0:.1f} s")
        return runs

    return cached_runs(tmp_path_factory, "runs", make)


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    t0 = time.monotonic()
    r = all_runs(tmp_path_factory)
    print(f"run folders ready in {time.monotonic() - t0:.1f} s")
    return r


def compare_json(a: Path, b: Path, **kw) -> dict:
    """In-process compare (the CLI's own function), as the JSON `servesweep compare --json` prints."""
    return json.loads(json.dumps(compare_runs(load_run(a), load_run(b), **kw).as_dict()))


def _by_metric(point: dict) -> dict[str, dict]:
    return {c["metric"]: c for c in point["changes"]}


def test_slower_emulator_is_worse_on_throughput_and_itl(runs):
    r = servesweep("compare", runs["fast"], runs["slow"], "--json")
    assert r.returncode == 0, r.stderr
    (rc,) = json.loads(r.stdout)
    assert [(p["prompt_tokens"], p["concurrency"]) for p in rc["points"]] == [(256, 4), (1024, 4)]
    assert sorted(rc["only_in_baseline"]) == ["s01.chat-p1024-o16-c1", "s01.chat-p256-o16-c1"]
    for p in rc["points"]:
        ch = _by_metric(p)
        tok = ch["output_tokens_per_s"]
        assert tok["verdict"] == "worse", tok
        assert (
            tok["b"] < tok["a"] and tok["change"] < -0.15
        )  # at under half the bandwidth, decode is much slower
        assert tok["ci_low"] <= tok["change"] <= tok["ci_high"] and tok["ci_high"] < 0
        itl = ch["itl_p50"]
        assert itl["verdict"] == "worse" and itl["ci_low"] > 0, itl
        assert ch["decode_tokens_per_s_mean"]["verdict"] == "worse"
        assert ch["error_rate"]["verdict"] == "within noise" and ch["error_rate"]["change_kind"] == "absolute"


def test_faster_run_is_better_against_slow_baseline(runs):
    rc = compare_json(runs["slow"], runs["fast"])
    assert len(rc["points"]) == 2
    for p in rc["points"]:
        ch = _by_metric(p)
        assert ch["output_tokens_per_s"]["verdict"] == "better"
        assert ch["itl_p50"]["verdict"] == "better"  # lower latency is better: direction-aware


def test_run_against_itself_is_never_better_or_worse(runs):
    """No change: never better or worse. "within noise" only where the interval shows the change is under
    --min-effect; where it reaches past it, the requests were too few to tell (issue 34, item 6: 4 requests a
    point gave [-95%, +1956%] and read "within noise")."""
    rc = compare_json(runs["fast"], runs["fast"])
    assert len(rc["points"]) == 4
    seen = set()
    for p in rc["points"]:
        for c in p["changes"]:
            assert c["change"] == 0.0
            if c["ci_low"] is None:
                assert c["verdict"] == "within noise", c  # a constant metric (error rate 0 in both)
                continue
            assert c["ci_low"] <= 0 <= c["ci_high"]
            wide = max(-c["ci_low"], c["ci_high"]) > rc["settings"]["min_effect"]
            assert c["verdict"] == ("not enough requests to tell" if wide else "within noise"), c
            seen.add(c["verdict"])
    assert "not enough requests to tell" in seen  # a few requests a point: some interval is that wide
    assert " vs baseline " in rc["summary"] and "4 points" in rc["summary"] and "not enough requests" in rc["summary"]
    assert sum(rc["counts"].values()) == sum(len(p["changes"]) for p in rc["points"])
    assert rc["counts"]["worse"] == rc["counts"]["better"] == 0


def test_verdicts_at_the_bounds():
    """The rule on its own: the interval against zero and ±min_effect."""
    from servesweep.results.compare import verdict

    lat = metric("ttft_p50")  # lower is better
    assert verdict(lat, 0.10, 0.05, 0.15, 0.02) == "worse"
    assert verdict(lat, -0.10, -0.15, -0.05, 0.02) == "better"
    assert verdict(lat, 0.01, 0.005, 0.015, 0.02) == "within noise"  # sure, and small
    assert verdict(lat, 0.0, -0.015, 0.019, 0.02) == "within noise"  # the interval within ±2%
    assert verdict(lat, 0.05, -0.95, 19.56, 0.02) == "not enough requests to tell"  # the interval
    assert verdict(lat, 0.0, -0.01, 0.03, 0.02) == "not enough requests to tell"


def test_summary_line_first_compact_mode_and_whole_names_at_80_columns(runs):
    """What a CI log shows: the summary line first; --compact: it and one line per better/worse change; at 80
    columns the metric names are whole (they were cut to `output_…`)."""
    r = servesweep("compare", runs["fast"], runs["slow"])
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert " vs baseline " in first and "2 points" in first and "worse" in first, r.stdout[:500]
    env = {**os.environ, "COLUMNS": "80"}
    narrow = subprocess.run(
        [sys.executable, "-m", "servesweep.cli", "compare", str(runs["fast"]), str(runs["slow"])],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert narrow.returncode == 0, narrow.stderr
    # the summary line and the cause lines are one line each at any width (grep-able in a CI log); the table fits
    lines = narrow.stdout.splitlines()
    table = [line for line in lines[1:] if not line.startswith("  cause ")]
    assert len(table) > 10 and max(len(line) for line in table) <= 80, narrow.stdout[:3000]
    assert all(line.rstrip().endswith(")") for line in lines if line.startswith("  cause "))  # not wrapped
    for name in ("output_tokens_per_s", "decode_tokens_per_s_mean", "itl_per_token_p50 (per token)"):
        assert name in narrow.stdout, narrow.stdout[:3000]
    assert "…" not in narrow.stdout
    compact = servesweep("compare", runs["fast"], runs["slow"], "--compact")
    assert compact.returncode == 0, compact.stderr
    lines = compact.stdout.splitlines()
    assert lines[0] == first
    changed = [line for line in lines[1:] if line.startswith("  WORSE ") or line.startswith("  BETTER ")]
    rc = compare_json(runs["fast"], runs["slow"])
    assert len(changed) == rc["counts"]["worse"] + rc["counts"]["better"] > 0
    assert any(" output_tokens_per_s: " in line and "interval [" in line for line in changed), changed
    assert "│" not in compact.stdout  # no table: the summary, the changes, and what did not match
    # and a line per point whose diagnosed cause changed (which depends on the machine's load: client-bound)
    assert all(line in changed or line.startswith(("unmatched: ", "  cause ")) for line in lines[1:]), lines


def test_values_are_the_records_values(runs):
    """compare's A and B columns equal the load core's summary.json and a hand computation from the records."""
    rc = compare_json(runs["fast"], runs["slow"])
    by_id = {p.point_id: p for p in load_run(runs["slow"]).done_points()}
    for p in rc["points"]:
        info = by_id[p["point_b"]]
        ch = _by_metric(p)
        s = info.summary
        assert ch["output_tokens_per_s"]["b"] == pytest.approx(s["output_tokens_per_s"], rel=1e-9)
        assert ch["ttft_p99"]["b"] == pytest.approx(s["ttft_ms"]["p99"], rel=1e-9)
        assert ch["itl_p99"]["b"] == pytest.approx(s["itl_ms"]["p99"], rel=1e-9)
        t = [r for r in pq.read_table(info.records_path).to_pylist() if not r["warmup"]]
        ok = [r for r in t if r["error_class"] is None]
        window = (max(r["end_ns"] for r in t) - min(r["scheduled_ns"] for r in t)) / 1e9
        assert ch["output_tokens_per_s"]["b"] == pytest.approx(
            sum(r["completion_tokens"] for r in ok) / window
        )
        ttft = [(r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in ok]
        assert ch["ttft_p50"]["b"] == pytest.approx(float(np.percentile(ttft, 50)))
        gaps = [(b - a) / 1e6 for r in ok for a, b in zip(r["chunk_ns"], r["chunk_ns"][1:], strict=False)]
        assert ch["itl_p50"]["b"] == pytest.approx(float(np.percentile(gaps, 50)))


def test_bootstrap_is_seeded(runs):
    a = compare_json(runs["fast"], runs["slow"], seed=7, resamples=300)
    b = compare_json(runs["fast"], runs["slow"], seed=7, resamples=300)
    c = compare_json(runs["fast"], runs["slow"], seed=8, resamples=300)
    assert a["points"] == b["points"]
    assert a["points"] != c["points"]  # other resamples, other interval ends
    assert a["settings"]["resamples"] == 300


def test_table_and_html_output(runs, tmp_path):
    html = tmp_path / "cmp.html"
    r = servesweep("compare", runs["fast"], runs["slow"], "--html", html)
    assert r.returncode == 0, r.stderr
    assert "worse" in r.stdout and "output_tokens_per_s" in r.stdout and "ttft_p99" in r.stdout
    assert f"html: {html}" in r.stdout
    text = html.read_text()
    assert text.count('data-verdict="worse"') >= 4  # tok/s and ITL p50 at both points at least
    # two points × the default metrics and the per-GPU rows of output tok/s and req/s (results/pergpu.py)
    assert len(DEFAULT_METRICS) == 11  # ITL per token (issue 34) joined the ten
    assert text.count("<tr data-point=") == 2 * (len(DEFAULT_METRICS) + 2)
    assert "http://" not in text and "https://" not in text and "<script" not in text


def test_report_with_a_baseline_has_the_comparison(runs, tmp_path):
    from servesweep.results.report import write_report

    html, md = write_report(runs["slow"], [runs["fast"]], tmp_path / "r.html", tmp_path / "r.md")
    text = html.read_text()
    assert 'id="comparison"' in text and text.count('data-verdict="worse"') >= 4
    assert "## Comparison with baseline" in md.read_text()


def test_metric_option_and_errors(runs, tmp_path):
    r = servesweep(
        "compare", runs["fast"], runs["slow"], "--json", "--metric", "output_tok_s", "--metric", "itl_p90"
    )
    assert r.returncode == 0, r.stderr
    assert [c["metric"] for c in json.loads(r.stdout)[0]["points"][0]["changes"]] == [
        "output_tokens_per_s",
        "output_tokens_per_s_per_gpu",  # right after its total
        "itl_p90",
    ]
    r = servesweep("compare", runs["fast"], runs["slow"], "--metric", "latency_p99")
    assert r.returncode == 2 and "unknown metric 'latency_p99'" in r.stderr
    r = servesweep("compare", runs["fast"], tmp_path / "nope")
    assert r.returncode == 2 and "nope: no such run folder" in r.stderr
    r = servesweep("compare", runs["fast"])
    assert r.returncode == 2 and "at least two run folders" in r.stderr
    r = servesweep("compare", runs["fast"], runs["dead"])  # nothing measured there: nothing to match
    assert r.returncode == 2 and "no matching points" in r.stderr


@pytest.mark.fast
def test_weighted_percentile_equals_numpy_on_the_expanded_sample():
    rng = np.random.default_rng(3)
    for _ in range(200):
        v = np.sort(rng.exponential(10, size=rng.integers(1, 30)))
        w = rng.integers(0, 4, size=v.size)
        if w.sum() == 0:
            continue
        q = float(rng.uniform(0, 100))
        assert weighted_percentile(v, w, q) == pytest.approx(float(np.percentile(np.repeat(v, w), q)))


@pytest.mark.fast
def test_metric_names():
    assert metric("output_tok_s").name == "output_tokens_per_s"
    assert metric("ttft_p99").higher_is_better is False
    assert metric("decode_tok_s_p50").name == "decode_tokens_per_s_p50"
    assert metric("decode_tok_s_p50").higher_is_better is True
    with pytest.raises(ValueError, match="needs a statistic"):
        metric("ttft")
    with pytest.raises(ValueError, match="unknown metric 'ttft_p101'"):
        metric("ttft_p101")


def test_one_configuration_of_a_run(runs):
    """runs/<id>:<config> keeps one configuration (to compare configurations of one run with each other)."""
    whole = compare_json(runs["fast"], runs["slow"], resamples=200)
    one = compare_json(f"{runs['fast']}:s01", f"{runs['slow']}:s01", resamples=200)
    assert one["points"] == whole["points"]
    r = servesweep("compare", f"{runs['fast']}:s09", runs["slow"])
    assert r.returncode == 2 and "no configuration 's09'; it has s01" in r.stderr

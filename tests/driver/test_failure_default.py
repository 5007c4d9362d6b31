"""The default failure threshold (issue 27): with no option given, `servesweep load`, `servesweep run` and
plain headless `locust -f locustfiles/llm.py` exit 3 when more than 1% of a point's measured requests failed,
and say why on stderr (point, failed share, threshold, top error class); a failure within the threshold exits
0 with a loud warning; `--max-failure-rate 100%` turns the share check off. Each test runs a real emulator
with seeded faults (docs/reports.md, "Exit codes")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import emulator_experiment_head

from servesweep.sim.launch import start_sim

SERVESWEEP = [sys.executable, "-m", "servesweep.cli"]
LOCUSTFILE = Path(__file__).resolve().parents[2] / "locustfiles" / "llm.py"
SIM = ["--model-path", "Qwen/Qwen3.6-27B", "--sim-calibration", "speedup=4"]
# 70% of the requests answer HTTP 500. Seed 1: the load core's probes (which retry) get through, the point
# gets some successes, so the exit status is the failure share's, not "no success" or "could not probe".
FAULTY = ["--sim-fault-rate", "500=0.7", "--sim-seed", "1"]
# One request in 200: seed 4 draws its one 500 at the 67th request (the probes come first; the draws are the
# emulator's own seeded sequence), so the point's measured share is 1 of 200 = 0.5%, under the 1% default.
ONE_IN_200 = ["--sim-fault-rate", "500=0.005", "--sim-seed", "4"]


def servesweep(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`servesweep ARGS` in `tmp_path`, its own session, stdout and stderr apart (the tests read which says what)."""
    return subprocess.run(
        [*SERVESWEEP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        start_new_session=True,
    )


def load(base_url: str, tmp_path: Path, *extra: str, requests: int = 10, concurrency: int = 2):
    return servesweep(
        tmp_path, "load", "--base-url", base_url, "--concurrency", str(concurrency), "--requests", str(requests),
        "--prompt-tokens", "100", "--output-tokens", "4", "--out", str(tmp_path / "runs"), *extra, timeout=240,
    )  # fmt: skip


def only_summary(tmp_path: Path) -> dict:
    (run,) = (tmp_path / "runs").iterdir()
    (f,) = run.glob("*/summary.json")
    return json.loads(f.read_text())


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines at the console width


def test_load_above_the_default_exits_3_and_says_why(tmp_path):
    with start_sim(SIM + FAULTY, log_path=tmp_path / "sim.log") as sim:
        r = load(sim.base_url, tmp_path)
    s = only_summary(tmp_path)
    failed, ok = s["requests"]["failed"], s["requests"]["ok"]
    assert failed and ok, s["requests"]  # some of each, or the seed tests "no success" instead
    assert r.returncode == 3, r.stdout + r.stderr
    err = flat(r.stderr)
    share = f"{failed / 10:.1%}"
    assert (
        f"failed: point c2: {failed} of 10 requests failed ({share} > max failure rate 1.0%); "
        f"top error class http_5xx ({failed} of 10)"
    ) in err, err
    # the way out is named with the reason
    assert "exit 3: 1 point(s) failed the failure check (--max-failure-rate 1.0%; 100% allows" in err, err
    assert s["failure_check"]["pass"] is False and s["failure_check"]["max_failure_rate"] == 0.01


def test_load_with_max_failure_rate_100_percent_exits_0_but_still_warns(tmp_path):
    with start_sim(SIM + FAULTY, log_path=tmp_path / "sim.log") as sim:
        r = load(sim.base_url, tmp_path, "--max-failure-rate", "100%")
    s = only_summary(tmp_path)
    failed = s["requests"]["failed"]
    assert failed and s["requests"]["ok"], s["requests"]
    assert r.returncode == 0, r.stdout + r.stderr
    err = flat(r.stderr)
    assert f"WARNING: point c2: {failed} of 10 requests failed" in err, err
    assert "within max failure rate 100.0%" in err, err
    assert "failed: point" not in err, err


def test_load_one_failure_in_200_exits_0_and_warns_loudly(tmp_path):
    with start_sim(SIM + ONE_IN_200, log_path=tmp_path / "sim.log") as sim:
        r = load(sim.base_url, tmp_path, requests=200, concurrency=8)
    s = only_summary(tmp_path)
    assert s["requests"]["failed"] == 1 and s["requests"]["measured"] == 200, s["requests"]
    assert r.returncode == 0, r.stdout + r.stderr
    err = flat(r.stderr)
    want = (
        "WARNING: point c8: 1 of 200 requests failed (0.5%, within max failure rate 1.0%); "
        "top error class http_5xx (1 of 200)"
    )
    assert want in err, err
    # the summary says it too (what a report or a CI script reads), and the table's failures column
    fc = s["failure_check"]
    assert fc["pass"] is True and fc["warning"] == want.removeprefix("WARNING: "), fc
    assert "http_5xx=1" in flat(r.stdout), r.stdout


def locust(base_url: str, tmp_path: Path, *extra: str, requests: int = 20):
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", base_url, "--headless"]
    cmd += ["-u", "2", "-r", "2", "--requests", str(requests)]
    cmd += ["--prompt-tokens", "100", "--output-tokens", "4"]
    cmd += ["--records", str(tmp_path / "r.parquet"), "--only-summary", "-t", "120s", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, start_new_session=True)


def error_classes(tmp_path: Path) -> list:
    return pq.read_table(tmp_path / "r.parquet").column("error_class").to_pylist()


def test_plain_headless_locust_above_the_default_exits_3(tmp_path):
    with start_sim(SIM + FAULTY, log_path=tmp_path / "sim.log") as sim:
        r = locust(sim.base_url, tmp_path)
    classes = error_classes(tmp_path)
    failed = sum(c is not None for c in classes)
    assert 0 < failed < len(classes) == 20, classes
    assert r.returncode == 3, r.stderr[-3000:]  # Locust's own rule would say 1
    assert (
        f"servesweep: FAILED: {failed / 20:.1%} of the requests failed, above --max-failure-rate 1.0% "
        f"(100% turns the check off): {20 - failed} of 20 measured requests succeeded; "
        f"failures: http_5xx {failed}"
    ) in r.stderr, r.stderr[-3000:]


def test_plain_headless_locust_within_the_default_exits_0_with_a_warning(tmp_path):
    """Locust alone exits 1 on any failed request; the locustfile's threshold replaces that rule, as in
    `servesweep load`: 1 failure in 200 exits 0, and says so."""
    with start_sim(SIM + ONE_IN_200, log_path=tmp_path / "sim.log") as sim:
        r = locust(sim.base_url, tmp_path, requests=200)
    classes = error_classes(tmp_path)
    assert len(classes) == 200 and sum(c is not None for c in classes) == 1, classes
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "servesweep: WARNING: 0.5% of the requests failed (within --max-failure-rate 1.0%): "
        "199 of 200 measured requests succeeded; failures: http_5xx 1"
    ) in r.stderr, r.stderr[-3000:]


def test_run_above_the_default_exits_3(tmp_path):
    """`servesweep run` with no load.max_failure_rate: the same 1% (30% injected 500s; the probes retry
    theirs)."""
    exp = tmp_path / "faulty.yaml"
    head = emulator_experiment_head(tmp_path, "faulty", load_time=0.1).replace(
        "sim_args: {sim_load_time: 0.1}",
        'sim_args: {sim_load_time: 0.1, sim_fault_rate: "500=0.3", sim_seed: 5}',
    )
    assert "sim_fault_rate" in head
    body = """\
        load:
          concurrency: [2]
          prompt_tokens: [100]
          output_tokens: 4
          requests: 10
        flush_cache_between_points: false
        """
    exp.write_text(head + textwrap.dedent(body))
    assert "max_failure_rate" not in exp.read_text()
    r = servesweep(tmp_path, "run", str(exp), "--out", str(tmp_path / "runs"))
    out = (r.stdout + r.stderr)[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    (p,) = json.loads((run / "manifest.json").read_text())["points"].values()
    assert p["status"] == "done", (p, out)
    counts = json.loads((run / p["dir"] / "summary.json").read_text())["requests"]
    failed = counts["failed"]
    assert 0 < failed < 10, counts  # above 1%, with successes: the share check, not "no success"
    assert r.returncode == 3, out
    err = flat(r.stderr)
    want = f"of 10 requests failed ({failed / 10:.1%} > max failure rate 1.0%); top error class http_5xx"
    assert want in err, err
    assert "exit 3: 1 point(s) failed the failure check (load.max_failure_rate 1.0%" in err, err


@pytest.mark.parametrize("bad", ["150%", "-0.1", "lots", ""])
def test_a_bad_max_failure_rate_is_a_usage_error(tmp_path, bad):
    """Checked before any server or load starts (no --base-url: it would start an emulator)."""
    r = load("http://127.0.0.1:9", tmp_path, "--max-failure-rate", bad)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--max-failure-rate" in r.stderr and "share" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.fast
def test_the_experiment_key_defaults_to_1_percent_and_takes_a_percentage():
    from pydantic import ValidationError

    from servesweep.config.experiment import DEFAULT_MAX_FAILURE_RATE, Load

    assert DEFAULT_MAX_FAILURE_RATE == 0.01
    assert Load(concurrency=[1], requests=1).max_failure_rate == 0.01
    assert Load(concurrency=[1], requests=1, max_failure_rate="100%").max_failure_rate == 1.0
    assert Load(concurrency=[1], requests=1, max_failure_rate=0.05).max_failure_rate == 0.05
    for bad in ("lots%", 1.5, "150%"):
        with pytest.raises(ValidationError, match="max_failure_rate"):
            Load(concurrency=[1], requests=1, max_failure_rate=bad)

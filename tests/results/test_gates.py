"""servesweep gate on real run folders (made by test_compare's helpers against the emulator): every exit code of the
one table (0 pass, 1 breach, 2 could not run, 3 too many failed requests; docs/reports.md "Exit codes"), the JUnit
file, SLO values equal to hand computations from records.parquet, the regression injected through a slower emulator
caught with --baseline, and evaluate_records for the Locust side.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_compare import all_runs, servesweep

from servesweep.config.slo import SLOError, parse_slo, parse_slos
from servesweep.results.gates import GateError, evaluate_records


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    t0 = time.monotonic()
    r = all_runs(tmp_path_factory)
    print(f"run folders ready in {time.monotonic() - t0:.1f} s")
    return r


def gate(*args) -> tuple[int, str, str]:
    r = servesweep("gate", *args)
    return r.returncode, r.stdout, r.stderr


def junit(path: Path) -> list[dict]:
    """testcases of a JUnit file as dicts: classname, name, outcome (passed/failure/skipped/error), message."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    out = []
    for tc in suite.findall("testcase"):
        outcome, msg = "passed", ""
        for tag in ("failure", "skipped", "error"):
            el = tc.find(tag)
            if el is not None:
                outcome, msg = tag, el.get("message", "")
        out.append(
            {"classname": tc.get("classname"), "name": tc.get("name"), "outcome": outcome, "message": msg}
        )
    assert int(suite.get("tests")) == len(out)
    assert int(suite.get("failures")) == sum(c["outcome"] == "failure" for c in out)
    assert int(suite.get("skipped")) == sum(c["outcome"] == "skipped" for c in out)
    return out


def done_points(run: Path) -> list[str]:
    m = json.loads((run / "manifest.json").read_text())
    return sorted(pid for pid, p in m["points"].items() if p["status"] == "done")


def test_pass_with_junit(runs, tmp_path):
    j = tmp_path / "gate.xml"
    code, out, err = gate(runs["fast"], "--slo", "ttft_p99<=30s", "--slo", "error_rate<=1%", "--junit", j)
    assert code == 0, (out, err)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("PASS ") and "8 checks passed, 2 skipped" in lines[0]
    cases = junit(j)
    done = done_points(runs["fast"])
    # one testcase per point × check, and the two infeasible points as skipped
    assert sorted((c["classname"], c["name"]) for c in cases if c["outcome"] == "passed") == sorted(
        (p, s) for p in done for s in ("ttft_p99<=30s", "error_rate<=1%")
    )
    skipped = [c for c in cases if c["outcome"] == "skipped"]
    assert len(skipped) == 2 and all("infeasible" in c["message"] for c in skipped)


def test_breach_names_point_value_and_limit(runs, tmp_path):
    j = tmp_path / "gate.xml"
    code, out, _ = gate(runs["fast"], "--slo", "itl_p50<=0.001ms", "--slo", "error_rate<=1%", "--junit", j)
    assert code == 1
    assert out.startswith("BREACH ") and "4 of 8 checks failed" in out and "breaks <= 0.001ms" in out
    failed = [c for c in junit(j) if c["outcome"] == "failure"]
    assert sorted(c["classname"] for c in failed) == done_points(runs["fast"])
    assert all(c["name"] == "itl_p50<=0.001ms" and c["message"].startswith("itl_p50 (per chunk) = ") for c in failed)


def test_slo_values_are_the_records_values(runs):
    """The gate's threshold sits exactly at the hand-computed value: just below passes, just above breaches."""
    pid = "s01.chat-p256-o16-c4"
    rows = [r for r in pq.read_table(runs["fast"] / pid / "records.parquet").to_pylist() if not r["warmup"]]
    ok = [r for r in rows if r["error_class"] is None]
    window = (max(r["end_ns"] for r in rows) - min(r["scheduled_ns"] for r in rows)) / 1e9
    tok_s = sum(r["completion_tokens"] for r in ok) / window
    ttft_p90 = float(np.percentile([(r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in ok], 90))
    code, out, _ = gate(
        runs["fast"],
        "--json",
        "--slo",
        f"output_tok_s>={tok_s * 0.9999}",
        "--slo",
        f"ttft_p90<={ttft_p90 * 1.0001}ms",
    )
    checks = [c for c in json.loads(out)["checks"] if c["point"] == pid]
    assert [c["passed"] for c in checks] == [True, True]
    code, out, _ = gate(
        runs["fast"],
        "--json",
        "--slo",
        f"output_tok_s>={tok_s * 1.0001}",
        "--slo",
        f"ttft_p90<={ttft_p90 * 0.9999}ms",
    )
    checks = [c for c in json.loads(out)["checks"] if c["point"] == pid]
    assert [c["passed"] for c in checks] == [False, False] and code == 1


def test_bad_input_exits_2_naming_it(runs, tmp_path):
    j = tmp_path / "gate.xml"
    code, out, _ = gate(runs["fast"], "--slo", "ttft_p99<=2x", "--junit", j)
    assert code == 2 and out.startswith("ERROR ") and "'ttft_p99<=2x'" in out
    (case,) = junit(j)
    assert case["outcome"] == "error" and "ttft_p99<=2x" in case["message"]
    for expr, says in [
        ("latency_p99<=2s", "unknown metric 'latency_p99'"),
        ("ttft_p99<=2%", "ttft_p99 is a latency; give ms or s"),
        ("error_rate<=5", "5 is not a fraction; write 5% or 0.05"),
        ("goodput_ratio>=90%", "need per-request SLOs"),
        ("ttft<=2s", "only say which requests are good"),
    ]:
        code, out, _ = gate(runs["fast"], "--slo", expr)
        assert code == 2 and says in out, (expr, out)
    code, out, _ = gate(runs["fast"], "--slo", "ttft_p99<=2s", "--max-regression", "lots")
    assert code == 2 and "--max-regression" in out


def test_missing_or_broken_folder_exits_2(tmp_path):
    code, out, _ = gate(tmp_path / "missing", "--slo", "ttft_p99<=2s")
    assert code == 2 and "missing: no such run folder" in out
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    code, out, _ = gate(tmp_path / "broken", "--slo", "ttft_p99<=2s")
    assert code == 2 and "not valid JSON" in out


def test_experiment_slos_are_used_when_none_given(runs):
    code, out, _ = gate(runs["fast"])  # the experiment says ttft_p99<=30s, error_rate<=1%
    assert code == 0 and "8 checks passed" in out
    code, out, _ = gate(runs["load"])  # a load folder: the SLOs `servesweep load --slo` recorded
    assert code == 0 and "1 checks passed" in out, out
    (rec,) = runs["load"].glob("*/records.parquet")  # a bare records file says nothing about SLOs
    code, out, _ = gate(rec)
    assert code == 2 and "nothing to check" in out


def test_points_not_measured_could_not_run(runs, tmp_path):
    """A failed or server_failed point is "could not run" (2), as `servesweep run` exits for the same folder, not a
    breach (1): CI tells an outage from a regression (issue 34, item 7)."""
    j = tmp_path / "gate.xml"
    code, out, _ = gate(runs["dead"], "--slo", "ttft_p99<=30s", "--junit", j)
    assert code == 2, out
    assert out.startswith(f"NOT MEASURED {runs['dead'].name}: 2 point(s) not measured"), out
    cases = junit(j)
    assert sorted(c["message"].split(":")[0] for c in cases) == ["point failed", "point server_failed"]
    assert any("cannot reach the server" in c["message"] for c in cases)
    code, out, _ = gate(runs["dead"], "--slo", "ttft_p99<=30s", "--json")
    assert code == 2 and json.loads(out)["verdict"] == "not measured"


def test_too_many_failed_requests_exit_3(runs, tmp_path):
    """The failure check of `load` and `run` (exit 3), from the point's records. The load folder's point lost a
    quarter of its requests to the first-token timeout; it was measured with --max-failure-rate 100%, which the gate
    keeps by default (test_experiment_slos_are_used_when_none_given: 0)."""
    (rec,) = runs["load"].glob("*/records.parquet")
    rows = [r for r in pq.read_table(rec).to_pylist() if not r["warmup"]]
    failed = sum(r["error_class"] is not None for r in rows)
    assert 0 < failed < len(rows)
    # 0: any failure fails the check, as `load --max-failure-rate 0` (the seeded stalls are 1 or more of 10)
    share = f"{failed} of {len(rows)} requests failed ({failed / len(rows):.1%} > max failure rate 0.0%)"
    j = tmp_path / "gate.xml"
    code, out, _ = gate(runs["load"], "--max-failure-rate", "0%", "--junit", j)
    assert code == 3, out
    assert out.startswith(f"FAILED {runs['load'].name}: 1 point(s) with too many failed requests"), out
    assert share in out and "; top error class " in out, out
    (case,) = [c for c in junit(j) if c["outcome"] == "failure"]
    assert case["name"] == "failed share <= 0.0%" and case["message"].startswith(share), case
    # 3 wins over a breach (the latencies of the rest mean little), and says the breach too
    code, out, _ = gate(runs["load"], "--max-failure-rate", "0", "--slo", "ttft_p50<=0.001ms")
    assert code == 3 and "besides, 1 of 2 checks failed" in out, out
    code, out, _ = gate(runs["load"], "--max-failure-rate", f"{failed / len(rows) / 2:.4f}", "--json")
    v = json.loads(out)
    assert (v["verdict"], v["exit_code"]) == ("failed", 3) and v["max_failure_rate"] > 0, v
    # a limit at or above the share passes; a share that is not one is bad input (2)
    assert gate(runs["load"], "--max-failure-rate", f"{failed / len(rows) * 100 + 1:.0f}%")[0] == 0
    assert gate(runs["load"], "--max-failure-rate", f"{failed / len(rows)}")[0] == 0  # above it, not at it
    code, out, _ = gate(runs["load"], "--max-failure-rate", "lots")
    assert code == 2 and "--max-failure-rate" in out, out
    code, out, _ = gate(runs["load"], "--max-failure-rate", "150%")
    assert code == 2 and "not a share between 0 and 1" in out, out


def test_every_exit_code_of_the_table_from_a_real_gate(runs):
    """The docs' one table (docs/reports.md "Exit codes") gives `gate` every code; each comes from a real gate on a
    run folder: 0 pass, 1 an SLO breached, 2 a run that could not measure, 3 too many failed requests."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "reports.md").read_text()
    table = docs[docs.index("| code | means |") :].split("\n\n", 1)[0].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    col = header.index("`gate`")
    gate_cells = {
        int(cells[0]): cells[col]
        for row in table[2:]
        if (cells := [c.strip() for c in row.strip("|").split("|")])[0].isdigit()
    }
    assert sorted(gate_cells) == [0, 1, 2, 3], gate_cells
    assert all(c.startswith("✓") for c in gate_cells.values()), gate_cells
    got = {
        0: gate(runs["fast"], "--slo", "ttft_p99<=30s"),
        1: gate(runs["fast"], "--slo", "ttft_p99<=0.001ms"),
        2: gate(runs["dead"], "--slo", "ttft_p99<=30s"),
        3: gate(runs["load"], "--slo", "ttft_p99<=30s", "--max-failure-rate", "1%"),
    }
    words = {0: "PASS ", 1: "BREACH ", 2: "NOT MEASURED ", 3: "FAILED "}
    for code, (rc, out, err) in got.items():
        assert rc == code and out.startswith(words[code]), (code, rc, out, err)


def test_goodput_from_per_request_slos(runs):
    code, out, _ = gate(runs["fast"], "--json", "--slo", "ttft<=30s", "--slo", "goodput_ratio>=99%")
    v = json.loads(out)
    assert code == 0 and all(c["value"] == "100%" for c in v["checks"] if c["kind"] == "slo")
    code, out, _ = gate(runs["fast"], "--slo", "ttft<=0.01ms", "--slo", "goodput_ratio>=1%")
    assert code == 1 and "goodput_ratio = 0%" in out


def test_regression_against_baseline_is_caught(runs, tmp_path):
    j = tmp_path / "gate.xml"
    code, out, _ = gate(runs["slow"], "--baseline", runs["fast"], "--max-regression", "10%", "--junit", j)
    assert code == 1, out
    assert out.startswith("BREACH ")
    failed = [c for c in junit(j) if c["outcome"] == "failure"]
    names = {c["name"].split()[0] for c in failed}
    assert {"output_tokens_per_s", "itl_p50", "decode_tokens_per_s_mean"} <= names
    assert all("worse" in c["message"] for c in failed)
    # the same run against itself, and the fast run against the slow one, pass
    assert gate(runs["slow"], "--baseline", runs["slow"])[0] == 0
    code, out, _ = gate(runs["fast"], "--baseline", runs["slow"], "--max-regression", "10%")
    assert code == 0, out
    # a limit above the largest change for the worse lets it through
    code, out, _ = gate(runs["slow"], "--baseline", runs["fast"], "--json", "--max-regression", "10%")
    changes = [c["value"].rstrip("%p ") for c in json.loads(out)["checks"] if c["kind"] == "regression"]
    worst = max(abs(float(v)) for v in changes if v not in ("", "-"))
    code, out, _ = gate(
        runs["slow"], "--baseline", runs["fast"], "--max-regression", f"{worst * 1.2 + 1:.0f}%"
    )
    assert code == 0, out


def test_evaluate_records_for_locust(runs):
    path = runs["load"] / next(d.name for d in runs["load"].iterdir() if d.is_dir()) / "records.parquet"
    v = evaluate_records(path, "ttft_p99<=30s,error_rate<=90%")
    assert v.passed and v.exit_code == 0 and v.line.startswith("PASS records: 2 checks passed")
    table = pq.read_table(path)
    v = evaluate_records(table, ["error_rate<=0.1%"], name="locust")
    assert not v.passed and v.exit_code == 1 and v.line.startswith("BREACH locust: 1 of 1 checks failed")
    (check,) = v.results
    failed = sum(e is not None for e in table.column("error_class").to_pylist())
    assert check.value == f"{failed / table.num_rows * 100:.3g}%"
    v = evaluate_records(table.to_pylist(), ["output_tok_s>=1"])  # rows as Locust keeps them
    assert v.passed
    with pytest.raises(GateError, match="'ttft_p99 <= fast'"):
        evaluate_records(table, ["ttft_p99 <= fast"])


@pytest.mark.fast
def test_the_code_that_says_least_was_measured_wins():
    """When several hold (servesweep.exit_codes): could not run (2: a point not measured or degraded), then too many
    failed requests (3), then a breach (1); the verdict line leads with the one that wins and counts the rest."""
    from servesweep.results.gates import CheckResult, Verdict

    ok = CheckResult("a", "error_rate<=1%", "slo", True)
    slo = CheckResult("a", "ttft_p99<=2s", "slo", False, message="ttft_p99 = 3 s (breaks <= 2s)")
    fail = CheckResult("a", "failed share <= 1.0%", "failures", False, message="7 of 10 requests failed")
    lost = CheckResult("b", "measured", "status", False, message="point server_failed: no server")
    deg = CheckResult("c", "not degraded", "degraded", False, message="degraded: worker lost")
    cases = [
        ([ok], 0, "pass", "PASS r: 1 checks passed"),
        ([ok, slo], 1, "breach", "BREACH r: 1 of 2 checks failed — a ttft_p99 = 3 s (breaks <= 2s)"),
        ([slo, fail], 3, "failed", "FAILED r: 1 point(s) with too many failed requests (their latencies mean "
         "little); besides, 1 of 2 checks failed — a 7 of 10 requests failed"),
        ([slo, fail, lost], 2, "not measured", "NOT MEASURED r: 1 point(s) not measured (the run could not run "
         "them); besides, 2 of 3 checks failed — b point server_failed: no server"),
        ([fail, lost, deg], 2, "degraded", "DEGRADED r: 1 point(s) measured at a lower load than asked"),
    ]  # fmt: skip
    for results, code, word, line in cases:
        v = Verdict(results, "r")
        assert (v.exit_code, v.as_dict()["verdict"]) == (code, word) and v.line.startswith(line), (v.line, code)
    assert Verdict([], "r", error="bad").as_dict()["verdict"] == "error"


@pytest.mark.fast
def test_slo_grammar():
    assert parse_slo("ttft_p99<=2s").value == 2000 and parse_slo("ttft_p99<=2s").metric.name == "ttft_p99"
    assert parse_slo("itl_p50<=30ms").value == 30 and parse_slo("itl_p50 <= 30").value == 30
    assert parse_slo("error_rate<=1%").value == pytest.approx(0.01)
    s = parse_slo("output_tok_s>=1200")
    assert (
        s.metric.name == "output_tokens_per_s" and s.value == 1200 and s.holds(1200) and not s.holds(1199.9)
    )
    assert parse_slo("request_rate>=2req/s").value == 2
    assert parse_slo("decode_tokens_per_s_p50>=20tok/s").metric.higher_is_better
    assert [x.text for x in parse_slos("ttft_p99<=2s, error_rate<=1%")] == ["ttft_p99<=2s", "error_rate<=1%"]
    with pytest.raises(SLOError, match="'ttft_p99=>2s'"):
        parse_slo("ttft_p99=>2s")
    with pytest.raises(SLOError, match="a rate in tok/s takes no unit 'ms'"):
        parse_slo("output_tok_s>=3ms")


def test_plain_headless_locust_records_are_gated(tmp_path):
    """The third way of use: `locust -f locustfiles/llm.py --headless ... --records r.parquet`, then the gate."""
    import subprocess
    import sys

    from test_compare import SIM_BASE

    from servesweep.results.report import write_report
    from servesweep.sim.launch import start_sim

    rec = tmp_path / "r.parquet"
    with start_sim(SIM_BASE, log_path=tmp_path / "sim.log") as sim:
        r = subprocess.run(
            [sys.executable, "-m", "locust", "-f", "locustfiles/llm.py", "--headless", "--host", sim.base_url,
             "-u", "2", "-r", "2", "-t", "60s", "-s", "10", "--only-summary", "--requests", "6",
             "--prompt-tokens", "256", "--output-tokens", "16", "--records", rec],
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent.parent,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    j = tmp_path / "gate.xml"
    code, out, _ = gate(rec, "--slo", "ttft_p99<=30s,error_rate<=1%", "--junit", j)
    assert code == 0 and out.startswith("PASS r: 2 checks passed"), out
    assert [c["outcome"] for c in junit(j)] == ["passed", "passed"]
    code, out, _ = gate(rec, "--slo", "ttft_p50<=0.01ms")
    assert code == 1 and "ttft_p50 = " in out
    html, md = write_report(rec)
    assert html == tmp_path / "r.report.html" and "<svg" in html.read_text()

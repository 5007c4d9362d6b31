"""One meaning per exit code for `servesweep load`, `servesweep run`, `servesweep gate` and plain headless Locust
(issue 34, item 7; servesweep.exit_codes; docs/reports.md "Exit codes"): 0 pass, 1 an SLO breached, 2 could not
run (server unreachable, bad input), 3 too many failed requests. Real processes, as a CI job runs them; the
breach (1) and failed-requests (3) codes of load and Locust are checked beside their features
(tests/driver/test_load_cli.py, tests/client/test_load_locustfile.py, tests/inlocust/test_headless.py), and every
code of gate, each from a real gate on a run folder, in tests/results/test_gates.py (it reads gate's column of the
table here); the ones here are those that used to be 1 for "could not run"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import emulator_experiment_head, refused_port, run_servesweep

from servesweep import exit_codes

LOCUSTFILE = Path(__file__).resolve().parents[1] / "locustfiles" / "llm.py"


@pytest.fixture
def closed_url():
    with refused_port() as port:
        yield f"http://127.0.0.1:{port}"


def _locust(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "-u", "2", "-r", "2", "-t", "2s"]
    cmd += ["--prompt-tokens", "200", "--output-tokens", "8", "--records", str(tmp_path / "r.parquet"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, start_new_session=True, env=os.environ)


def test_the_codes():
    assert (exit_codes.PASS, exit_codes.BREACH, exit_codes.COULD_NOT_RUN, exit_codes.FAILED_REQUESTS) == (0, 1, 2, 3)
    assert exit_codes.CouldNotRun("x").exit_code == 2


def test_the_domain_errors_carry_their_code_and_click_s_wording():
    """What domain code raises instead of click's exceptions (issue 29), and the code each ends the command with
    (servesweep.cli.base turns them into click's; their output: tests/test_cli.py)."""
    assert exit_codes.CommandError("x").exit_code == 1  # click's ClickException, as before
    assert exit_codes.UsageError("x").exit_code == exit_codes.COULD_NOT_RUN
    bad = exit_codes.BadOption("'0' is not a positive integer", "--concurrency")
    assert bad.exit_code == exit_codes.COULD_NOT_RUN
    assert str(bad) == "Invalid value for --concurrency: '0' is not a positive integer"
    assert isinstance(bad, exit_codes.CouldNotRun)
    assert not isinstance(exit_codes.CommandError("x"), exit_codes.CouldNotRun)


def _docs_table() -> dict[int, dict[str, str]]:
    """docs/reports.md's one table: {code: {command column: cell}}."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "reports.md").read_text()
    rows = docs[docs.index("| code | means |") :].split("\n\n", 1)[0].splitlines()

    def cells(row: str) -> list[str]:
        return [c.strip() for c in row.strip().strip("|").split("|")]

    header = cells(rows[0])
    return {int(c[0]): dict(zip(header[2:], c[2:], strict=True)) for c in map(cells, rows[2:]) if c[0].isdigit()}


def test_every_command_has_every_code_in_the_docs_table():
    """One meaning per code for every command a CI job runs: no command lacks one (gate's 3 was "–" before it
    judged a point's failed requests as load and run do)."""
    table = _docs_table()
    assert sorted(table) == [0, 1, 2, 3], table
    for code, row in table.items():
        assert list(row) == ["`load`", "`run`", "`gate`", "`locust --headless`"], row
        missing = [cmd for cmd, cell in row.items() if not cell or cell.startswith(("–", "-"))]
        assert not missing, f"exit code {code}: no meaning for {missing} in docs/reports.md"


def test_the_docs_table_gives_a_degraded_point_2():
    """A point measured at a lower load than asked (a lost Locust worker, issue 35) is "could not run": the one
    table says so (its behaviour: tests/results/test_degraded.py)."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "reports.md").read_text()
    (row,) = [line for line in docs.splitlines() if line.startswith("| 2 | could not run:")]
    assert "a degraded point (measured at a lower load than asked" in row, row


def test_load_against_an_unreachable_server_is_2(tmp_path, closed_url):
    url = closed_url
    rc, out = run_servesweep(
        "load", "--base-url", url, "--requests", "2", "--out", str(tmp_path / "runs"), timeout=120
    )
    assert rc == 2, out[-3000:]
    assert f"Error: probing {url}" in out, out[-3000:]
    assert not (tmp_path / "runs").exists()  # nothing measured, no empty run folder


def test_headless_locust_against_an_unreachable_server_is_2(tmp_path, closed_url):
    """Caught at start, where the locustfile lists the server's models (a server that stops answering later: every
    request failed before a response, tests/inlocust/test_headless.py)."""
    url = closed_url
    r = _locust(tmp_path, "--host", url)
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"servesweep: COULD NOT RUN: listing models (attempt 4 of 4): GET {url}/v1/models: cannot reach" in r.stderr


def test_headless_locust_without_a_host_or_with_bad_options_is_2(tmp_path, closed_url):
    r = _locust(tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "servesweep: COULD NOT RUN: give the server with --host http://HOST:PORT" in r.stderr, r.stderr[-3000:]
    r = _locust(tmp_path, "--host", closed_url, "--first-token-timeout", "soon")
    assert r.returncode == 2, r.stderr[-3000:]


def test_run_breaching_the_experiments_slo_is_1_and_a_bad_file_2(tmp_path):
    exp = tmp_path / "slo.yaml"
    exp.write_text(
        emulator_experiment_head(tmp_path, "slo", load_time=0.1)
        + textwrap.dedent(
            """\
            load:
              concurrency: [1]
              prompt_tokens: [100]
              output_tokens: 4
              requests: 2
            slo:
              - ttft_p99<=0.001ms
            """
        )
    )
    rc, out = run_servesweep("run", str(exp), "--out", str(tmp_path / "runs"), timeout=300)
    assert rc == 1, out[-3000:]
    text = " ".join(out.split())
    assert "exit 1: an SLO of the experiment breached at 1 point(s)" in text, out[-3000:]
    assert "ITL/chunk p50" in text and "ITL/token p50" in text  # the point line and table say which ITL (item 1)
    (run_dir,) = (tmp_path / "runs").iterdir()
    rc, gate = run_servesweep("gate", str(run_dir), timeout=120)
    assert rc == 1 and "BREACH" in gate, gate  # the gate says the same of the run

    exp.write_text(exp.read_text().replace("  base: {", "  base: {gpu_memory_utilization: 0.85, "))
    rc, out = run_servesweep("run", str(exp), "--out", str(tmp_path / "runs2"), timeout=120)
    assert rc == 2 and "gpu_memory_utilization is vLLM's" in out, out[-3000:]

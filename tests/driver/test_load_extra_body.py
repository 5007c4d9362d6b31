"""`servesweep load --extra-body`: request-body extras from the command line reach every request; `n: 2` against
the emulator records two choices per request. A bad value is a usage error that names the option."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from servesweep.cli.load import command

FAST_SIM = "--sim-calibration speedup=4 --enable-cache-report"
OUT = 8


def test_extra_body_n2_records_two_choices_per_request(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "servesweep.cli", "load", "--concurrency", "2", "--requests", "4"]
        + ["--prompt-tokens", "500", "--output-tokens", str(OUT), "--extra-body", '{"n": 2}']
        + ["--sim-args", FAST_SIM, "--out", "runs", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env=dict(os.environ),
        start_new_session=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (point,) = json.loads(r.stdout)["points"]
    assert point["point"]["extra_body"] == {"n": 2}
    (run_dir,) = (tmp_path / "runs").iterdir()
    (records,) = run_dir.rglob("records.parquet")
    rows = pq.read_table(records).to_pylist()
    assert len(rows) == 4 and all(row["error_class"] is None for row in rows)
    for row in rows:
        assert row["choices"] == 2 and row["choice_completion_tokens"] == [OUT, OUT]
        assert row["completion_tokens"] == 2 * OUT


@pytest.mark.fast
def test_bad_extra_body_names_the_option(tmp_path):
    base = ["--base-url", "http://127.0.0.1:9", "--requests", "1", "--out", str(tmp_path / "runs")]
    for value, words in [
        ("{n: 2}", "is not JSON"),
        ("[2]", "is not a JSON object"),
        ('{"max_tokens": 5}', "set by the load generator"),
    ]:
        r = CliRunner().invoke(command, [*base, "--extra-body", value])
        assert r.exit_code == 2 and "--extra-body" in r.output and words in r.output, r.output
    assert not (tmp_path / "runs").exists()

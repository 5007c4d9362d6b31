"""`locust -f locustfiles/llm.py --headless ...` by hand or in CI, driven in this process (locustrun.LocalRun).

Moved from tests/client/test_load_locustfile.py and tests/client/test_locust_headless.py, where each ran a `locust`
subprocess: servesweep's options, Locust's own CSV with the LLM rows, the records file, the SLO gate, the stop
timeout a headless run takes when none is given, and the failure gate (exit 3) of plain headless Locust. The exit
status of a real process stays checked there (test_ci_run_fails_on_a_breached_slo, the distributed runs).
"""

from __future__ import annotations

import csv

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from locustrun import LocalRun
from support import completed_by_emulator

from servesweep.client.outcome import failure_verdict


def _messages(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def ci_run(sim, tmp_path, *extra) -> LocalRun:
    run = LocalRun(
        *("--host", sim.base_url, "--headless", "-u", "2", "-r", "2", "--requests", "4"),
        *("--prompt-tokens", "500", "--output-tokens", "8", "--records", str(tmp_path / "r.parquet")),
        *("--csv", str(tmp_path / "stats"), "--only-summary", *extra),
    )
    run.run(timeout=60)
    return run


def test_ci_run_writes_records_and_locust_stats(sim_fast, tmp_path, capsys):
    """A request budget ends the run by itself; the records file has every request, Locust's CSV (written once a
    second, so the run waits for its last rewrite) has the LLM rows, and the POST row is the end-to-end time."""
    run = ci_run(sim_fast, tmp_path, "--slo", "ttft_p99<=60s,error_rate<=0%")
    assert run.exit_code == 0  # an SLO that holds, no failure
    assert "PASS" in capsys.readouterr().out  # the gate's verdict line
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows == 4 and t.column("error_class").null_count == 4
    rows = {(row["Type"], row["Name"]): row for row in csv.DictReader(open(tmp_path / "stats_stats.csv"))}
    assert int(rows[("LLM", "TTFT")]["Request Count"]) == 4
    assert int(rows[("LLM", "E2E")]["Request Count"]) == 4
    assert int(rows[("POST", "/v1/chat/completions")]["Failure Count"]) == 0
    # the POST row is E2E, not time to headers
    assert float(rows[("POST", "/v1/chat/completions")]["Average Response Time"]) == pytest.approx(
        float(rows[("LLM", "E2E")]["Average Response Time"]), rel=0.01
    )


def test_ci_run_fails_on_a_breached_slo(sim_fast, tmp_path, capsys):
    run = ci_run(sim_fast, tmp_path, "--slo", "ttft_p99<=1ms")
    assert run.exit_code == 1  # issue 8: 1 is a breach
    out = capsys.readouterr().out
    assert "BREACH" in out and "ttft_p99" in out, out[-2000:]


def headless(sim, tmp_path, *extra, run_time: float) -> LocalRun:
    run = LocalRun(
        *("--host", sim.base_url, "--headless", "-u", "2", "-r", "2"),
        *("--records", str(tmp_path / "r.parquet"), "--only-summary", *extra),
    )
    run.run(timeout=60, run_time=run_time)
    return run


def test_without_stop_timeout_the_streams_running_at_the_end_are_measured(sim_real, tmp_path, caplog):
    """-t 1 s, streams of about 1.5 s, no -s: the run takes the point's stop timeout, so the two streams running
    at -t finish and are recorded, and every stream the emulator finished is in the records."""
    run = headless(sim_real, tmp_path, "--prompt-tokens", "310", "--output-tokens", "100", run_time=1.0)
    assert run.exit_code == 0, _messages(caplog)[-3000:]
    assert "no -s/--stop-timeout" in _messages(caplog)
    assert run.env.stop_timeout == run.env.servesweep.point.effective_stop_timeout() > 1.5
    t = pq.read_table(tmp_path / "r.parquet")
    assert t.num_rows >= 2, _messages(caplog)[-3000:]  # at ba9c018: 0 records (every stream was cut at -t)
    assert t.column("error_class").null_count == t.num_rows
    assert set(t.column("completion_tokens").to_pylist()) == {100}
    done = completed_by_emulator(sim_real, 310)
    assert done == set(t.column("request_id").to_pylist()), (len(done), t.num_rows)


def test_an_explicit_zero_stop_timeout_says_why_there_are_no_records(sim_real, tmp_path, capsys):
    run = headless(
        sim_real, tmp_path, "-s", "0", "--prompt-tokens", "350", "--output-tokens", "100", run_time=1.0
    )
    assert run.exit_code == 3
    err = capsys.readouterr().err
    assert "servesweep: 0 records" in err and "--stop-timeout is 0" in err, err[-3000:]
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 0


def test_every_request_failed_exits_non_zero_naming_the_error_class(sim_real, tmp_path, capsys):
    # Locust's own rule (any failure: exit 1) switched off, as servesweep load does: the run still fails.
    run = headless(
        sim_real,
        tmp_path,
        *("--prompt-tokens", "5000", "--output-tokens", "8", "--exit-code-on-error", "0"),
        run_time=1.0,
    )
    assert run.exit_code == 3
    err = capsys.readouterr().err
    assert "no request succeeded" in err and "http_400_context" in err, err[-3000:]
    # Locust counted the failures too: its own rule alone would have given 1, not 0
    assert run.runner.stats.total.num_failures > 0


def _table(classes, warm=None):
    return pa.table(
        {
            "error_class": pa.array(classes, pa.string()),
            "warmup": pa.array(warm or [False] * len(classes), pa.bool_()),
        }
    )


def test_max_failure_rate_judges_the_failure_share():
    """The verdict on a records table: counts, the share against --max-failure-rate, the classes, and why a run
    without a measured request has none."""
    t = _table([None] * 9 + ["http_500"])
    default, above, within = failure_verdict(t, None), failure_verdict(t, 0.05), failure_verdict(t, 0.1)
    assert default[0] is False and "9 of 10" in default[1]
    assert above[0] is True and "10.0%" in above[1] and "http_500 1" in above[1]
    assert within[0] is False
    all_failed = failure_verdict(_table(["http_429", "http_429"]), 1.0)
    assert all_failed[0] is True and "http_429 2" in all_failed[1]
    only_warmup = failure_verdict(_table([None], [True]), None, 30.0)
    assert only_warmup[0] is True and "warmup" in only_warmup[1]
    none = failure_verdict(_table([]), None, 0.0)
    assert none[0] is True and "--stop-timeout is 0" in none[1]


def test_a_server_that_never_answered_could_not_run():
    """Every request refused, reset or timed out before any response (the server went away after the start's
    probe): exit 2, could not run, not 3; one response among them (an HTTP 500) makes it failed requests."""
    from servesweep.client.outcome import never_answered

    def table(classes, headers):
        t = _table(classes)
        t = t.append_column("headers_ns", pa.array(headers, pa.int64()))
        msgs = [
            None if c is None else "ConnectionRefusedError: [Errno 111] Connection refused" for c in classes
        ]
        return t.append_column("error_message", pa.array(msgs, pa.string()))

    gone = table(["connection_reset", "timeout_connect"], [None, None])
    assert never_answered(gone)
    failed, msg = failure_verdict(gone, 0.01)
    assert failed and msg.startswith("servesweep: COULD NOT RUN: the server never answered: 2 of 2 requests")
    assert "Connection refused" in msg and "check --host" in msg
    assert not never_answered(table(["connection_reset", "http_5xx"], [None, 5]))
    assert not never_answered(table(["connection_reset", None], [None, 5]))
    assert not never_answered(_table(["connection_reset"]))  # a table without the column: not judged so

"""How a Locust process of servesweep ends: its records written (Parquet, with clients.json beside them), the SLO
gate of --slo, and for plain headless Locust the failure verdict and exit status.

Exit codes of a headless Locust process (servesweep.exit_codes; the table: docs/reports.md, "Exit codes"): 1 an
SLO breached, 2 could not run (bad options, the gate could not run, the server never answered; Locust's own 2 for
an unhandled error), 3 no successful request or a failure share above --max-failure-rate (plain headless Locust).
Locust's --exit-code-on-error rule (1 on any failure) is replaced by --max-failure-rate.
4: the process that started this one (servesweep load/run, or the local master) is gone (client/watch.py).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from servesweep.client.clients import Clients, client_status
from servesweep.client.state import ClientState, Role
from servesweep.exit_codes import COULD_NOT_RUN, FAILED_REQUESTS
from servesweep.results.records import write_parquet

EXIT_FAILURES = FAILED_REQUESTS
EXIT_PARENT_GONE = 4
# A request that failed so (no response headers, one of these classes) never reached a server that answers.
_NEVER_ANSWERED = frozenset({"connection_reset", "timeout_connect"})


def write_records(environment: Any, state: ClientState | None) -> Path | None:
    """The records of this process (a local runner's own, or every worker's on the master) to --records, and
    clients.json beside them; None when there is nothing to write to."""
    opts = environment.parsed_options
    if state is None or opts is None or not opts.records or state.point is None or state.is_worker:
        return None
    path = Path(opts.records)
    point = state.load.point if state.load is not None else state.point
    write_parquet(
        state.buffer.table(),
        path,
        metadata={"point_id": point.id, "point": point.model_dump_json()},
    )
    if state.role is Role.LOCAL:  # its own counters and headroom
        if state.load is not None:
            clients = Clients()
            status = client_status(state.load, state.sampler, reset=False)
            clients.update("local", {**status, "role": "local"})
            clients.write(path.with_name("clients.json"))
    else:
        state.clients.note_exits()
        if state.sampler is not None:
            state.clients.by_id.pop("master", None)
            state.clients.update(
                "master",
                {
                    "worker": f"master {socket.gethostname()}:{os.getpid()}",
                    "role": "master",
                    **state.sampler.take(reset=False),
                },
            )
        state.clients.write(path.with_name("clients.json"))
    return path


def slo_gate(environment: Any, state: ClientState, opts: Any) -> None:
    if not opts.slo:
        return
    from servesweep.config.slo import parse_slos
    from servesweep.results.gates import GateError, evaluate_records

    try:
        if all(s.per_request for s in parse_slos(opts.slo)):
            return  # per-request SLOs (ttft<=2s) shape goodput; there is no aggregate to gate on
        name = state.point.id if state.point else "locust"
        verdict = evaluate_records(state.buffer.table(), opts.slo, name=name)
    except (GateError, ValueError) as e:
        print(f"servesweep: SLO gate could not run: {e}")
        environment.process_exit_code = COULD_NOT_RUN
        return
    print(verdict.line, flush=True)
    if verdict.exit_code:
        environment.process_exit_code = verdict.exit_code  # 1 breach, 2 could not run


def never_answered(table) -> bool:
    """Every request failed before any response (no headers; refused, reset or timed out connecting): the server
    is down or the address is wrong, so nothing was measured (exit 2, not 3)."""
    if table.num_rows == 0 or "headers_ns" not in table.column_names:
        return False
    classes, headers = table.column("error_class").to_pylist(), table.column("headers_ns").to_pylist()
    return all(c in _NEVER_ANSWERED and h is None for c, h in zip(classes, headers, strict=True))


def failure_verdict(
    table, max_failure_rate: float | None, stop_timeout: float | None = None
) -> tuple[bool, str]:
    """(failed, message) for a headless run's records: failed when no measured request succeeded, or when more than
    `max_failure_rate` of them failed. The message says how many succeeded and which error classes the failures
    had, or, with no measured request at all, why there is none."""
    from collections import Counter

    warm = table.column("warmup").to_pylist()
    classes = [c for c, w in zip(table.column("error_class").to_pylist(), warm, strict=True) if not w]
    n, n_warm = len(classes), sum(1 for w in warm if w)
    if never_answered(table):
        first = next((m for m in table.column("error_message").to_pylist() if m), "")
        return True, (
            f"servesweep: COULD NOT RUN: the server never answered: {table.num_rows} of {table.num_rows} requests "
            f"failed before a response ({first}); check --host and that the server is up"
        )
    if n == 0:
        why = f"{n_warm} warmup request(s) finished and no measured one" if n_warm else "no request finished"
        if stop_timeout is not None and stop_timeout <= 0:
            why += (
                "; -s/--stop-timeout is 0, so the streams still running at the end were dropped: give -s longer"
                " than a request lasts"
            )
        else:
            why += " (the run ended before any stream did: a longer -t, or check the server and its log)"
        return True, f"servesweep: 0 records: {why}"
    failed = Counter(c for c in classes if c is not None)
    n_failed = sum(failed.values())
    line = f"{n - n_failed} of {n} measured requests succeeded"
    if failed:
        line += "; failures: " + ", ".join(f"{k} {v}" for k, v in failed.most_common())
    if n_failed == n:
        return True, f"servesweep: FAILED: no request succeeded: {line}"
    if max_failure_rate is not None and n_failed / n > max_failure_rate:
        return True, (
            f"servesweep: FAILED: {n_failed / n:.1%} of the requests failed, above --max-failure-rate "
            f"{max_failure_rate:.1%} (100% turns the check off): {line}"
        )
    if n_failed:
        # within the threshold, and still said loudly: the exit status alone would hide these
        limit = "none" if max_failure_rate is None else f"{max_failure_rate:.1%}"
        share = f"{n_failed / n:.1%} of the requests failed"
        return False, f"servesweep: WARNING: {share} (within --max-failure-rate {limit}): {line}"
    return False, f"servesweep: {line}"


def failure_gate(environment: Any, state: ClientState, opts: Any) -> None:
    """Plain headless Locust: never end with 0 records, or with every request failed, and exit 0. A process
    servesweep started (--point-json) is judged by servesweep on its side."""
    if not getattr(opts, "headless", False) or state.from_point_json:
        return
    rate = getattr(opts, "max_failure_rate", None)
    table = state.buffer.table()
    failed, msg = failure_verdict(table, rate, environment.stop_timeout)
    print(msg, file=sys.stderr, flush=True)
    if failed:
        environment.process_exit_code = COULD_NOT_RUN if never_answered(table) else EXIT_FAILURES
    elif rate is not None and environment.process_exit_code is None:
        # Within --max-failure-rate (always set: it has a default): Locust's any-failure rule
        # (--exit-code-on-error) does not apply, so plain Locust exits as `servesweep load` does.
        environment.process_exit_code = 0

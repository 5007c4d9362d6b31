"""Suite-wide guards.

The pytest process must never import Locust or gevent: gevent's monkey-patching would leak into every later test,
and ansible-runner hangs in a patched process. Tests that need Locust run it in a subprocess."""

import os
import sys
from pathlib import Path

import pytest

# Caches the tests build (SGLang's protocol code, SGLang's CPU venv, prompt pools) go to the project's .cache/ also
# when pytest is started without make (the Makefile exports the same); `make test-cold` points it elsewhere.
os.environ.setdefault("SERVESWEEP_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache"))

# The in-Locust session (gevent patched, Locust's runner driven in process) is its own pytest process:
# `pytest tests/inlocust` (make test-fast and make test run it). Collected here, its conftest would patch this one.
collect_ignore = ["inlocust"]


@pytest.fixture(autouse=True)
def _no_gevent_in_the_test_process(request):
    yield
    if "gevent" in sys.modules or "locust" in sys.modules:
        pytest.fail(
            f"{request.node.nodeid} imported Locust/gevent into the pytest process; run that code in a subprocess"
        )


# ------------------------------------------------------------------------------------------------ the fast tier
# `make test-fast` runs the tests marked `fast` (pure functions, schemas, parsers, planners) with
# SERVESWEEP_TEST_TIER=fast. In that tier nothing may start a process: every way Python starts one raises here, so
# a test marked `fast` that starts an emulator, Locust or Ansible fails at once and names itself, and the tier stays
# under a minute as the suite grows. Checked for the whole session (module- and session-scoped fixtures too).
FAST_TIER = os.environ.get("SERVESWEEP_TEST_TIER") == "fast"


def pytest_configure(config):
    if not FAST_TIER:
        return
    import subprocess

    def refuse(*args, **kwargs):
        raise RuntimeError(
            "a test of the fast tier started a process; fast tests start none (remove its `fast` mark: "
            "make test runs it)"
        )

    subprocess.Popen._execute_child = refuse
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            setattr(os, name, refuse)


# ---------------------------------------------------------------------------- the order files go to the workers
# `make test` hands whole files to three pytest-xdist workers (--dist loadfile) in collection order
# (--no-loadscope-reorder: xdist's own reorder puts files with many tests first, so the few-but-long matrix files
# ran last and three workers spent the suite's last minutes on a tail of them). Longest first instead (LPT
# scheduling): these files, slowest first as measured on this 2-core machine (per-file time of a full run,
# 2026-12-02); every other file follows in its usual order. A stale list only costs time, never a test.
SLOWEST_FIRST = [
    "tests/driver/test_multihost.py",  # ~300 s with the remote-worker faults (2026-12-04)
    "tests/test_bench_chaos.py",  # ~200 s: the 2-host chaos smoke (issue 35)
    "tests/matrix/test_packed_kills.py",
    "tests/matrix/test_packed_hosts.py",
    "tests/matrix/test_faults_server.py",  # ~200 s
    "tests/matrix/test_faults_prometheus.py",  # ~180 s
    "tests/results/test_diagnosis.py",  # ~120 s
    "tests/matrix/test_packed_crash.py",
    "tests/matrix/test_capacity_examples.py",
    "tests/matrix/test_orchestrator.py",
    "tests/matrix/test_reliability_server.py",
    "tests/matrix/test_answer_probes.py",
    "tests/matrix/test_reliability_kills.py",
    "tests/matrix/test_packed_dry_run.py",
    "tests/client/test_parent_death.py",
    "tests/matrix/test_generic_server.py",
    "tests/driver/test_signals.py",
    "tests/matrix/test_secret_sources.py",
    "tests/matrix/test_process_ownership.py",
    "tests/matrix/test_packed_secrets.py",
    "tests/driver/test_ansible_role.py",
    "tests/matrix/test_isolation.py",
    "tests/observe/test_live_stack.py",
    "tests/longrun/test_longrun.py",
    "tests/matrix/test_capacity_step_time.py",
    "tests/results/test_gates.py",
    "tests/matrix/test_secrets.py",
    "tests/matrix/test_reliability_disk.py",
    "tests/matrix/test_examples.py",
    "tests/matrix/test_search.py",
    "tests/matrix/test_unexpected_error.py",
    # 30-45 s each under five workers (cold run, 2026-12-04), late in collection order otherwise: the suite's tail
    "tests/test_bench_smoke.py",
    "tests/client/test_webui.py",
    "tests/matrix/test_trace_experiment.py",
    "tests/client/test_webui_charts.py",
    "tests/matrix/test_replay_capacity.py",
    "tests/matrix/test_capacity_agent.py",
    "tests/observe/test_locust_in_stack.py",
    "tests/observe/test_prometheus_e2e.py",
    "tests/workload/test_workloads.py",
    "tests/telemetry/test_point_energy.py",
    "tests/test_exit_code_table.py",
    "tests/workload/test_trace_replay.py",
]


def pytest_collection_modifyitems(session, config, items):
    rank = {f: i for i, f in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable for the rest


# ------------------------------------------------------------------------------- where the suite's CPU goes, per test
# `SERVESWEEP_TEST_CPU_LOG=/path pytest ...` appends one JSON line per test: its wall time and the CPU seconds of the
# pytest worker and of the children it reaped meanwhile (Locust, the emulator, Ansible and what they waited for).
# The suite is CPU-bound on 2 cores, so a test's CPU, not its wall time under five workers, is what it costs the
# suite. Processes that outlive their test (a module fixture's server) count where they are reaped.
CPU_LOG = os.environ.get("SERVESWEEP_TEST_CPU_LOG")


if CPU_LOG:
    import json
    import resource
    import time

    def _cpu() -> tuple[float, float]:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    _outcome: dict[str, str] = {}

    def pytest_runtest_logreport(report):
        # the call's outcome, unless a phase failed (setup, call or teardown) or the test was skipped
        if (report.failed or report.skipped or report.when == "call") and _outcome.get(report.nodeid) != "failed":
            _outcome[report.nodeid] = report.outcome

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        t0, (own0, kids0) = time.monotonic(), _cpu()
        yield
        own1, kids1 = _cpu()
        row = {"test": item.nodeid, "outcome": _outcome.pop(item.nodeid, "?"),
               "wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(own1 - own0, 2),
               "children_cpu_s": round(kids1 - kids0, 2)}  # fmt: skip
        with open(CPU_LOG, "a") as f:
            f.write(json.dumps(row) + "\n")

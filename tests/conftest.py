"""Suite-wide guards.

The pytest process must never import Locust or gevent: gevent's monkey-patching would leak into every later test,
and ansible-runner hangs in a patched process. Tests that need Locust run it in a subprocess."""

import sys

import pytest

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
FAST_TIER = __import__("os").environ.get("SERVESWEEP_TEST_TIER") == "fast"


def pytest_configure(config):
    if not FAST_TIER:
        return
    import os
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

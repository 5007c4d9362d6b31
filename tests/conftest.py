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

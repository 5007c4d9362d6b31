"""The in-Locust session: the locustfile's logic driven in this process, through Locust's own runner.

Run on its own, never inside `pytest tests` (tests/conftest.py ignores this folder):

    .venv/bin/pytest -q -p no:cacheprovider tests/inlocust

gevent's monkey-patching is process-wide and cannot be undone, and ansible-runner hangs in a patched process, so
this session is a process of its own where gevent is allowed, and the main session keeps its guard. Here, as in
Locust's own runner tests, a real `Environment` with a `LocalRunner` runs servesweep's user class
(`locustrun.LocalRun` mirrors what `locust.main` does between parsing the options and the exit status) against a
real emulator process; what each test checks used to need a `locust` subprocess.
"""

# First thing, before pytest's plugins import anything more: patch the process the way `import locust` does for
# the `locust` command (locust/__init__.py: gevent.monkey.patch_all()), so sockets, ssl, threads and subprocesses
# of everything imported later are gevent's.
import warnings

from gevent import monkey

with warnings.catch_warnings():
    # pytest's anyio plugin (autoloaded) imported ssl already; only anyio.streams.tls keeps unpatched names, and
    # nothing here uses anyio's TLS streams. Every other module sees gevent's ssl.
    warnings.filterwarnings("ignore", "Monkey-patching ssl after ssl has already been imported")
    monkey.patch_all()

import gc  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
import locust  # noqa: E402
import locust.log  # noqa: E402
import pytest  # noqa: E402

from servesweep.sim.launch import start_sim  # noqa: E402

MODEL = "Qwen/Qwen3.6-27B"


@pytest.fixture(autouse=True)
def _no_gevent_in_the_test_process():
    """Overrides the main session's guard of the same name (tests/conftest.py): here gevent is the point."""
    yield


def _hooks() -> dict[str, list]:
    return {
        name: list(hook._handlers)
        for name, hook in vars(locust.events).items()
        if isinstance(hook, locust.event.EventHook)
    }


def _live_greenlets() -> set[int]:
    return {id(g) for g in gc.get_objects() if isinstance(g, gevent.Greenlet) and not g.dead}


@pytest.fixture(autouse=True)
def _fresh_locust(caplog):
    """Each test gets Locust as a fresh `locust` process would have it.

    The locustfile registers its listeners on Locust's global `events` (a real process has one Environment), and
    every runner, web UI and servesweep state adds more: without this a later test's requests would also feed the
    stats of earlier runners. The greenlets a run leaves (samplers, step watch, chart sampler: they end with a real
    process) are killed, and the objects the locustfile froze out of the collector (gc.freeze) are released."""
    caplog.set_level(logging.INFO)  # servesweep's INFO lines are what a user reads on the console
    before, greenlets, argv = _hooks(), _live_greenlets(), list(sys.argv)
    locust.log.unhandled_greenlet_exception = False
    yield
    sys.argv = argv  # LocalRun sets the command line of the run
    gc.unfreeze()
    left = [
        g
        for g in gc.get_objects()
        if isinstance(g, gevent.Greenlet) and not g.dead and id(g) not in greenlets
    ]
    gevent.killall(left, block=True, timeout=5)
    for name, handlers in before.items():
        getattr(locust.events, name)._handlers = handlers


def _sim(tmp_path_factory, name, args):
    d = tmp_path_factory.mktemp(name)
    with start_sim(["--model-path", MODEL, *args], ground_truth=d / "gt.jsonl", log_path=d / "sim.log") as s:
        yield s


@pytest.fixture(scope="session")
def sim_fast(tmp_path_factory):
    """The emulator 4x faster than the real step model: short streams for the runs whose timing is not the point."""
    yield from _sim(tmp_path_factory, "sim_fast", ["--sim-calibration", "speedup=4"])


@pytest.fixture(scope="session")
def sim_real(tmp_path_factory):
    """Real step-model timing (a 100-token stream lasts about 1.5 s) and a 4096-token context."""
    yield from _sim(tmp_path_factory, "sim_real", ["--context-length", "4096"])


@pytest.fixture(scope="session")
def sim_faults(tmp_path_factory):
    """An emulator that refuses or breaks some requests (429, 500, disconnects), seeded."""
    faults = ["--sim-fault-rate", "429=0.1,500=0.05,disconnect=0.05", "--sim-seed", "3"]
    yield from _sim(tmp_path_factory, "sim_faults", ["--sim-calibration", "speedup=4", *faults])

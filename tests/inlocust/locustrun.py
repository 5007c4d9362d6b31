"""One Locust run in this (gevent-patched) process, as `locust -f locustfiles/llm.py ARGS` runs it.

`LocalRun` follows `locust.main.main` for a local runner, step by step and with Locust's own functions: options
from Locust's parser (servesweep's arguments come from the locustfile's init_command_line_parser listener), the
Environment from `locust.main.create_environment`, the local runner, the web UI (not served: requests go to its
Flask app), the init event, the headless or --autostart start, the CSV writer, and the shutdown (quitting event, the
exit status by main's rule, quit event). Only the process around it is left out, so a run costs its load alone.

`DistributedRun` does the same for a master and its workers (`locust -f locustfiles/llm.py --master ...` and
`... --worker ...`), all in this process and talking over loopback ZeroMQ, the way Locust's own runner tests drive a
MasterRunner and WorkerRunners (locust/test/test_runners.py, TestMasterWorkerRunners). What makes several Locust
processes out of one is said where it is done: each has its own `Events` (`process_events`, `_events_of`), its own
name in the records (`Worker`), and no parent watch (`DistributedRun`).
"""

from __future__ import annotations

import copy
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import gevent
import locust
import locust.log
from locust import stats
from locust.argument_parser import get_parser
from locust.event import EventHook, Events
from locust.main import create_environment

# What locustfiles/llm.py imports, in its order: the web UI module first (it changes which options exist).
from servesweep.client import webui  # noqa: F401
from servesweep.client.state import client_state
from servesweep.client.user import LLMUser, LoadContext

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "locustfiles" / "llm.py"


class LocalRun:
    def __init__(self, *argv: str, web_ui: bool = False) -> None:
        # The process's own command line, as `locust` would have it: Locust's web UI parses sys.argv again for the
        # start form's extra options, and the locustfile reads it (--point-json). The conftest restores it.
        sys.argv = ["locust", "-f", str(LOCUSTFILE), *argv]
        self.opts = get_parser().parse_args(sys.argv[1:])
        self.env = create_environment(
            [LLMUser],
            self.opts,
            events=locust.events,
            locustfile=LOCUSTFILE.name,
            parsed_locustfiles=[str(LOCUSTFILE)],
            available_user_classes={"LLMUser": LLMUser},
            available_shape_classes={},
            available_user_tasks={"LLMUser": LLMUser.tasks},
        )
        self.runner = self.env.create_local_runner()
        self.csv_writer = None
        if self.opts.csv_prefix:
            self.csv_writer = stats.StatsCSVFileWriter(
                self.env, stats.PERCENTILES_TO_REPORT, self.opts.csv_prefix, self.opts.stats_history_enabled
            )
        self.web_ui = None
        if web_ui and not self.opts.headless:
            self.web_ui = self.env.create_web_ui(
                host="127.0.0.1", port=0, delayed_start=True, stats_csv_writer=self.csv_writer
            )
        self.env.events.init.fire(environment=self.env, runner=self.runner, web_ui=self.web_ui)
        # main: an exception in an init handler is fatal (exit 1)
        assert not locust.log.unhandled_greenlet_exception, "an init listener raised (see the log)"
        if self.csv_writer is not None:
            gevent.spawn(self.csv_writer.stats_writer)
        self.exit_code: int | None = None

    def get(self, path: str):
        """A GET on the web UI's Flask app (what the browser or a poller would fetch)."""
        assert self.web_ui is not None
        return self.web_ui.app.test_client().get(path)

    def start(self, run_time: float | None = None) -> None:
        """main's start_automatic_run: the shape, or -u users at -r; -t (or `run_time`, which may be fractional
        here: Locust's -t takes whole seconds) quits the runner, which stops the users within --stop-timeout."""
        o = self.opts
        if o.num_users is None:
            o.num_users = 1
        if o.spawn_rate is None:
            o.spawn_rate = 1
        if self.env.shape_class:
            self.runner.start_shape()
        else:
            gevent.spawn(self.runner.start, o.num_users, o.spawn_rate)
        run_time = run_time if run_time is not None else o.run_time
        if run_time:
            gevent.spawn_later(run_time, self.runner.quit)

    def wait(self, timeout: float) -> None:
        """Until the runner's greenlets are gone (a quit: the budget, -t, the point's own end), as main joins them."""
        self.runner.greenlet.join(timeout=timeout)
        if len(self.runner.greenlet):  # greenlets leave their group when they end
            self.runner.quit()
            raise AssertionError(f"the run did not end within {timeout} s (state {self.runner.state})")

    def wait_shape(self, timeout: float) -> None:
        """--autostart with a shape: main joins the shape greenlet, then stops the test (no --autoquit here)."""
        g = self.runner.shape_greenlet
        if g is not None:
            g.join(timeout=timeout)
        if g is not None and not g.dead:
            raise AssertionError(f"the shape did not end within {timeout} s")
        self.runner.stop()

    def shutdown(self) -> int:
        """main's shutdown(): the quitting event, then the exit status: environment.process_exit_code when set,
        else --exit-code-on-error when any request failed or a task raised, else 2 after an unhandled greenlet
        exception, else 0."""
        code = main_shutdown(self.env, self.runner, self.opts)
        if self.csv_writer is not None:
            self.csv_writer.close_files()
        self.exit_code = code
        return code

    def run(self, timeout: float = 60.0, run_time: float | None = None) -> int:
        """A headless run from start to exit status."""
        self.start(run_time)
        self.wait(timeout)
        return self.shutdown()


def main_shutdown(env, runner, opts) -> int:
    """main's shutdown() up to its sys.exit: the quitting event, the exit status, the runner's quit, the quit event."""
    env.events.quitting.fire(environment=env, reverse=True)
    if env.process_exit_code is not None:
        code = env.process_exit_code
    elif len(runner.errors) or len(runner.exceptions):
        code = opts.exit_code_on_error
    elif locust.log.unhandled_greenlet_exception:
        code = 2
    else:
        code = 0
    runner.quit()
    env.events.quit.fire(exit_code=code)
    return code


def wait_until(cond: Callable[[], object], timeout: float, what: str, period: float = 0.1):
    """Poll `cond` (patched: other greenlets run meanwhile) until it returns something true; return that."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(period)


# ---------------------------------------------------------------------------------------------- master and workers


def _global_hooks() -> dict[str, EventHook]:
    return {name: h for name, h in vars(locust.events).items() if isinstance(h, EventHook)}


def process_events() -> Events:
    """The `events` of one more Locust process in this one. In a real process `environment.events` is
    `locust.events`, which holds what importing the locustfile registered (servesweep's init, test_start, test_stop,
    quitting ... listeners); here each process gets a fresh `Events` holding those same listeners, so that a worker's
    report, request or quitting event reaches its own listeners only (Locust's stats and runners register theirs on
    `environment.events`, one per process)."""
    events = Events()
    for name, hook in _global_hooks().items():
        getattr(events, name)._handlers = list(hook._handlers)
    return events


@contextmanager
def _events_of(env) -> Iterator[None]:
    """While one process's init listeners run, Locust's global `events` is that process's own: a listener the
    locustfile adds to `locust.events` at init (client/distributed.py's worker_hooks and master_hooks do; in a real
    process that object is environment.events) joins that process only, in the order a real process has it."""
    hooks = _global_hooks()
    saved = {name: h._handlers for name, h in hooks.items()}
    for name, h in hooks.items():
        h._handlers = getattr(env.events, name)._handlers
    try:
        yield
    finally:
        for name, h in hooks.items():
            h._handlers = saved[name]


class LocustProcess:
    """One `locust -f locustfiles/llm.py ARGS` process of a distributed run, in this one, as main runs it: options
    from Locust's parser, the Environment (with `process_events()`), the runner, the init event, and at the end of
    the runner's greenlets (main joins them) main's shutdown, whose exit status lands in `exit_code`."""

    def __init__(self, *argv: str) -> None:
        # the process's command line: the locustfile reads it at init (whether to watch its parent)
        sys.argv = ["locust", "-f", str(LOCUSTFILE), *argv]
        self.opts = get_parser().parse_args(sys.argv[1:])
        self.env = create_environment(
            [LLMUser],
            self.opts,
            events=process_events(),
            locustfile=LOCUSTFILE.name,
            parsed_locustfiles=[str(LOCUSTFILE)],
            available_user_classes={"LLMUser": LLMUser},
            available_shape_classes={},
            available_user_tasks={"LLMUser": LLMUser.tasks},
        )
        self.runner = self._create_runner()
        with _events_of(self.env):
            self.env.events.init.fire(environment=self.env, runner=self.runner, web_ui=None)
        assert not locust.log.unhandled_greenlet_exception, "an init listener raised (see the log)"
        self.exit_code: int | None = None
        self.main: gevent.Greenlet | None = None

    def _create_runner(self):
        raise NotImplementedError

    def _main(self) -> None:
        self.runner.greenlet.join()
        self.exit_code = main_shutdown(self.env, self.runner, self.opts)

    @property
    def ended(self) -> bool:
        return self.main is not None and self.main.dead


class Master(LocustProcess):
    """`--master`: started by `start()` as a headless master starts itself (main's start_automatic_run).
    `test_start_ns`: when its test started (time.monotonic_ns(), the records' clock): a duration point's clock."""

    def __init__(self, *argv: str) -> None:
        super().__init__(*argv)
        self.test_start_ns: int | None = None
        self.env.events.test_start.add_listener(
            lambda **_k: setattr(self, "test_start_ns", time.monotonic_ns())
        )

    def _create_runner(self):
        return self.env.create_master_runner(self.opts.master_bind_host, self.opts.master_bind_port)

    @property
    def port(self) -> int:
        return self.runner.server.port

    def start(self, timeout: float = 30.0) -> None:
        """Wait for --expect-workers workers, start -u users at -r, quit at -t, and main's join-then-shutdown."""
        o = self.opts
        ready = f"{o.expect_workers} workers ready"
        wait_until(lambda: len(self.runner.clients.ready) >= o.expect_workers, timeout, ready)
        if o.num_users is None:
            o.num_users = 1
        if o.spawn_rate is None:
            o.spawn_rate = 1
        gevent.spawn(self.runner.start, o.num_users, o.spawn_rate)
        if o.run_time:
            gevent.spawn_later(o.run_time, self.runner.quit)
        self.main = gevent.spawn(self._main)


class Worker(LocustProcess):
    """`--worker`: connects when created (Locust's runner blocks until the master acknowledges), then runs until the
    master tells it to quit or its share of the point is done (main: join the runner, then shut down).

    Records name their process (`worker`: host:pid); the workers of this process share one pid, so each is named
    `<name>:<pid>` as a worker on host `name` is. `reports` keeps every report this worker sent to the master
    (Locust's stats, servesweep's records and live stats), as sent."""

    def __init__(self, *argv: str, name: str) -> None:
        self.name = name
        self.reports: list[dict] = []
        self.killed = False
        self.end_ns: int | None = None  # when this worker got the master's end of a duration point (END_MSG)
        super().__init__(*argv)
        self._rename()
        self._stamp_end()
        # last: after every listener of the locustfile and the web UI module (the context may be built at test start)
        self.env.events.test_start.add_listener(lambda **_k: self._rename())
        self.env.events.report_to_master.add_listener(
            lambda client_id, data, **_k: self.reports.append(copy.deepcopy(data))
        )
        self.main = gevent.spawn(self._main)

    def _create_runner(self):
        return self.env.create_worker_runner(self.opts.master_host, self.opts.master_port)

    def _stamp_end(self) -> None:
        """The locustfile's END_MSG handler, stamped when it runs: a worker stops sending when the end reaches it,
        a message's trip after the master's timer (the same in real processes, over the network)."""
        from servesweep.client.messages import END_MSG

        entry = self.runner.custom_messages.get(END_MSG)
        if entry is None:
            return
        handler, concurrent = entry

        def stamped(*args, **kwargs):
            self.end_ns = self.end_ns or time.monotonic_ns()
            return handler(*args, **kwargs)

        self.runner.custom_messages[END_MSG] = (stamped, concurrent)

    def _rename(self) -> None:
        state = client_state(self.env)
        if state is not None and state.load is not None:
            state.load.worker = f"{self.name}:{os.getpid()}"

    @property
    def ctx(self) -> LoadContext:
        state = client_state(self.env)
        assert state is not None and state.load is not None, "this worker has no load yet"
        return state.load

    def kill(self) -> None:
        """What the master sees of a SIGKILLed worker: nothing more from it (no last report, no quit message), its
        heartbeats stop. Its users stop where they are; what they finished and had not shipped stays here."""
        self.killed = True
        assert self.main is not None
        self.main.kill(block=True)  # no shutdown: no quitting event, no quit message
        self.runner.greenlet.kill(block=True)  # heartbeats, reports, the master's messages
        self.runner.user_greenlets.kill(block=True)
        self.runner.client.close(linger=0)


_FLOCK = fcntl.flock


def _cooperative_flock(fd, operation: int) -> None:
    """flock as a greenlet of this process waits for it: without blocking the other processes of this one. Workers
    that build the same prompt pool at once take the pool cache's lock (workload/prompts.py); in real processes the
    one that waits blocks alone, here a blocking flock would stop the holder too, for ever."""
    if operation & fcntl.LOCK_NB or operation & fcntl.LOCK_UN:
        return _FLOCK(fd, operation)
    while True:
        try:
            return _FLOCK(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            gevent.sleep(0.01)


class DistributedRun:
    """A master and its workers in this process. `master_argv` is a master's command line after `-f FILE`
    (it must say --master); without --master-bind-port the master binds a free port of loopback instead of 5557.
    Each entry of `workers_argv` is one worker's command line (it must say --worker); the harness adds
    `--master-host 127.0.0.1 --master-port <the master's>`. Workers are named w1, w2, ... in the records.

    Nothing watches a parent here (SERVESWEEP_WATCH_PARENT=0): the locustfile's watch ends a process whose parent
    died with os._exit, which here would be the test session. A file lock waits as a greenlet
    (`_cooperative_flock`), as it waits in a process of its own."""

    def __init__(self, master_argv: Sequence[str], workers_argv: Sequence[Sequence[str]]) -> None:
        assert "--master" in master_argv and all("--worker" in w for w in workers_argv)
        self._watch = os.environ.get("SERVESWEEP_WATCH_PARENT")
        os.environ["SERVESWEEP_WATCH_PARENT"] = "0"
        fcntl.flock = _cooperative_flock
        self._globals = {name: list(h._handlers) for name, h in _global_hooks().items()}
        master_argv = list(master_argv)
        if "--master-bind-port" not in master_argv:
            master_argv += ["--master-bind-host", "127.0.0.1", "--master-bind-port", "0"]
        self.master: Master = None  # type: ignore[assignment]  # set below; close() may come first
        self.workers: list[Worker] = []
        try:
            self.master = Master(*master_argv)
            for i, argv in enumerate(workers_argv):
                at = ("--master-host", "127.0.0.1", "--master-port", str(self.master.port))
                self.workers.append(Worker(*argv, *at, name=f"w{i + 1}"))
        except BaseException:
            self.close(check=False)
            raise

    def start(self, timeout: float = 30.0) -> None:
        self.master.start(timeout)

    def wait(self, timeout: float) -> None:
        """Until the master and every worker not killed have ended (their exit statuses set)."""
        procs = [self.master, *(w for w in self.workers if not w.killed)]
        try:
            wait_until(lambda: all(p.ended for p in procs), timeout, "the master and its workers end", 0.05)
        except AssertionError:
            states = {w.name: w.runner.state for w in self.workers}
            raise AssertionError(
                f"not ended within {timeout} s: master {self.master.runner.state}, workers {states}"
            ) from None

    def run(self, timeout: float = 60.0) -> int:
        """A headless run from the master's start to every exit status; returns the master's."""
        self.start()
        self.wait(timeout)
        assert self.master.exit_code is not None
        return self.master.exit_code

    def close(self, check: bool = True) -> None:
        """What the end of the processes would release: their sockets, and their greenlets (stopped runners).
        `check`: fail when a listener was added to Locust's global events outside an init (no process fires it)."""
        for p in [*self.workers, *([self.master] if self.master is not None else [])]:
            if p.main is not None:
                p.main.kill(block=True)
            p.runner.greenlet.kill(block=True)
            p.runner.user_greenlets.kill(block=True)
        for w in self.workers:
            w.runner.client.close(linger=0)
        if self.master is not None:
            self.master.runner.server.close(linger=0)
        fcntl.flock = _FLOCK
        if self._watch is None:
            os.environ.pop("SERVESWEEP_WATCH_PARENT", None)
        else:
            os.environ["SERVESWEEP_WATCH_PARENT"] = self._watch
        # a listener added to Locust's global events after init would be fired by no process of this one
        added = {
            name: [h for h in hook._handlers if h not in self._globals.get(name, [])]
            for name, hook in _global_hooks().items()
        }
        added = {k: v for k, v in added.items() if v}
        assert not (check and added), f"listeners added to Locust's global events outside init: {added}"

    def __enter__(self) -> DistributedRun:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        self.close(check=exc_type is None)  # a failure inside the block is the one to see

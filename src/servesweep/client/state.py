"""servesweep's state in one Locust process: one `ClientState` on `environment.servesweep`, made once at Locust's
init (client/plugin.py), its role (master, worker or local runner; web UI or headless) decided there and never
again. The users' shared state of one point is its `load` (a `user.LoadContext`; never on a master)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servesweep.client.clients import Clients, Sampler
from servesweep.results.records import RecordBuffer

if TYPE_CHECKING:
    from servesweep.client.charts import Series
    from servesweep.client.feed import Feed
    from servesweep.client.user import LoadContext
    from servesweep.client.webui import LiveState
    from servesweep.config.point import LoadPoint
    from servesweep.observe.exporter import ClientMetrics


class Role(enum.Enum):
    LOCAL = "local"  # one process generates the load and writes the records
    MASTER = "master"  # workers generate it; the master merges their records and writes them
    WORKER = "worker"  # generates its share and ships its records to the master with each report


def role_of(runner: Any) -> Role:
    from locust.runners import MasterRunner, WorkerRunner

    if isinstance(runner, MasterRunner):
        return Role.MASTER
    if isinstance(runner, WorkerRunner):
        return Role.WORKER
    return Role.LOCAL


@dataclass
class ClientState:
    """Everything servesweep keeps in one Locust process (environment.servesweep)."""

    role: Role
    headless: bool = False  # --headless: no web UI, the command line starts and ends the test
    # the web UI module (client/webui.py, loaded by locustfiles/llm.py) owns the start form, the ramp and the
    # exporter: it rebuilds the point's load when a start changes the form's options
    ui_module: bool = False
    from_point_json: bool = False  # servesweep started this process: the point came as --point-json
    forked: bool = False  # a worker Locust's --processes forked (its master is its parent)
    point: LoadPoint | None = None  # None: no host yet (a worker's comes with the master's first spawn)
    load: LoadContext | None = None  # the users' shared state (local runner, worker)
    merged: RecordBuffer = field(default_factory=RecordBuffer)  # master: every worker's records
    clients: Clients = field(default_factory=Clients)  # master, local at the end: clients.json
    drained: set[str] = field(default_factory=set)  # master: workers that finished and shipped every record
    sampler: Sampler | None = None  # this process's headroom since the test start
    prepare: Callable[[LoadContext], None] | None = None  # a load's share, sampler, status file, at first use
    abandoned: bool = False  # the parent or the master is gone: exit EXIT_PARENT_GONE
    feed: Feed | None = None  # the parent's live view of the records (client/feed.py)
    metrics: ClientMetrics | None = None  # when this process serves /metrics (client/exporter_feed.py)
    live: LiveState | None = None  # the web UI module's live state
    series: Series | None = None  # the web UI module's chart series

    @property
    def is_master(self) -> bool:
        return self.role is Role.MASTER

    @property
    def is_worker(self) -> bool:
        return self.role is Role.WORKER

    @property
    def buffer(self) -> RecordBuffer:
        """The records this process holds: the load's (local, worker) or the workers' merged (master)."""
        return self.load.buffer if self.load is not None else self.merged

    @property
    def in_flight(self) -> int:
        """Streams this process has open now."""
        return self.load.in_flight if self.load is not None else 0


def client_state(environment: Any) -> ClientState | None:
    """servesweep's state of this Locust process; None before init or in a process servesweep did not set up."""
    st = getattr(environment, "servesweep", None)
    return st if isinstance(st, ClientState) else None

"""The private parts of Locust, gevent and geventhttpclient that servesweep uses (client/locust_internals.py) are
still there in the installed versions, and those are the versions they were checked against: an upgrade fails
here, naming what to re-read, instead of breaking a run at its end (records that never ship, exit codes lost)."""

from __future__ import annotations

import importlib.metadata

import gevent.os
import gevent.socket
from geventhttpclient.response import HTTPSocketPoolResponse
from locust.env import Environment
from locust.runners import WorkerRunner

from servesweep.client import locust_internals
from servesweep.client.user import LLMUser


def test_installed_versions_are_the_checked_ones():
    installed = {name: importlib.metadata.version(name) for name in locust_internals.CHECKED}
    assert installed == locust_internals.CHECKED, (
        "re-read the parts client/locust_internals.py uses in these versions, then update its CHECKED: "
        f"{installed} installed, {locust_internals.CHECKED} checked"
    )


def test_the_private_parts_exist():
    assert callable(WorkerRunner._send_stats)
    assert isinstance(gevent.os._watched_children, dict)
    assert callable(Environment._validate_shape_class_instance)
    env = Environment(user_classes=[LLMUser])
    env.shape_class = None
    locust_internals.validate_shape(env)  # no shape: nothing to check, and no error
    # geventhttpclient's response classes set both in their constructors; the pool's liveness check is looked up
    # per use
    init = {
        name
        for cls in HTTPSocketPoolResponse.__mro__
        if "__init__" in vars(cls) and hasattr(vars(cls)["__init__"], "__code__")
        for name in vars(cls)["__init__"].__code__.co_names
    }
    assert {"_sock", "_body_buffer"} <= init, sorted(init)
    from geventhttpclient.connectionpool import ConnectionPool

    assert callable(getattr(ConnectionPool, "_is_socket_alive", None))
    assert isinstance(locust_internals.forked_worker_exits(), dict)
    # Locust's worker reads the module constant at each round of its wall-clock check of the master's heartbeat
    # (take_over_master_timeout sets it to infinity and servesweep's watch takes over)
    from geventhttpclient import HTTPClient

    assert "_connection_pool" in HTTPClient.__init__.__code__.co_names
    with gevent.socket.socket() as sock:  # rxstamp's wait reads it in place (per chunk)
        assert sock._read_event is not None
    assert "MASTER_HEARTBEAT_TIMEOUT" in WorkerRunner.heartbeat_timeout_checker.__code__.co_names
    assert "last_heartbeat_timestamp" in WorkerRunner.heartbeat_timeout_checker.__code__.co_names
    from locust.runners import (
        MasterRunner,  # hold_end_for_missing: Locust's ends go through these instance calls
    )

    assert {"stop", "quit", "check_stopped", "worker_count"} <= set(MasterRunner.handle_message.__code__.co_names)
    assert {"stop", "check_stopped", "_users_dispatcher"} <= set(MasterRunner.heartbeat_worker.__code__.co_names)
    assert "_users_dispatcher" in MasterRunner.stop.__code__.co_names

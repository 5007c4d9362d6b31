"""servesweep.net: the one free_port. What every caller relies on: the port it returns can be bound on the host it
was asked for, at once."""

import socket

import pytest

from servesweep.net import free_port

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_port_can_be_bound_on_the_host(host):
    port = free_port(host)
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, port))
        s.listen()
        assert s.getsockname()[1] == port


def test_the_default_host_is_loopback():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
